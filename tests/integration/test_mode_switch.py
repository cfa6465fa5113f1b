"""A node switched between the device plugin and DRA by its config label, both plugins running.

The device plugin (with the simulated kubelet) and the DRA plugin run unmodified on the stand-in NVML
(one T4) against a real kube-apiserver, both following per-node entries `dp` (flags.mode
device-plugin) and `dra` (flags.mode dra). The test plays the kubelet's node status: a thread copies
the simulated kubelet's healthy count into the Node's allocatable (0 for a resource whose plugin went
away, as the kubelet does). A sampler reads the Node's allocatable and the node's ResourceSlices every
0.1 s through the whole story:

1. start on `dp`: the device plugin advertises nvidia.com/gpu 1, the DRA plugin publishes nothing;
2. label `dra`: the device plugin withdraws, the DRA plugin publishes gpu-0 once allocatable shows 0;
   a ModeSwitched Event (Normal) "device-plugin -> dra";
3. label `dp`: the DRA plugin deletes its slice, the device plugin registers once it is gone;
4. a pod asking for nvidia.com/gpu runs on the node: label `dra` is refused, the device plugin keeps
   advertising, a ModeSwitchRefused Event names the pod (once, from the device plugin); the pod deleted,
   the node switches by itself;
5. in DRA mode a pod holds a claim on the node's GPU: label `dp` is refused (the Event from the DRA
   plugin); the pod deleted, the node switches back.

At no sample are both advertised (allocatable > 0 and a slice with devices).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import NodeStatus
from lightkube.types import PatchType

from nvdp.kube import connect, get_node_allocatable, list_slices
from sim.kubelet import KubeletSim
from sim.nvml import NodeSim
from tests.kube.envtest import ControlPlane
from tests.kube.kubelet_pod_resources import KubeletPodResources

from .cdi_node import make_cdi_node
from .conftest import clean_env
from .test_node_config import entries_dir
from .test_node_config_rule import Daemon

pytestmark = pytest.mark.slow
LABEL = "nvidia.com/device-plugin.config"
DRIVER = "gpu.nvidia.com"
GPU = "nvidia.com/gpu"
ENTRIES = {"dp": "version: v1\nflags:\n  mode: device-plugin\n", "dra": "version: v1\nflags:\n  mode: dra\n"}
# A refused switch is tried again every 10 s (nvdp.daemon.pernode.nodechoice.RETRY_PENDING_S); the node
# status of a
# real kubelet comes every 10 s, here every 0.2 s.
SWITCH_S = 30.0


@dataclass(frozen=True)
class Sample:
    at: float
    allocatable: int
    devices: int  # devices in the node's slices


class NodeStatusMirror:
    """The kubelet's node status: the simulated kubelet's healthy count -> the Node's allocatable."""

    def __init__(self, kubelet: KubeletSim, client: Any, node: str) -> None:
        self.kubelet, self.client, self.node = kubelet, client, node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._last: int | None = None

    def healthy(self) -> int:
        if GPU not in self.kubelet.resources():
            return 0
        return sum(1 for d in self.kubelet.devices(GPU) if d["health"] == "Healthy")

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            count = self.healthy()
            if count != self._last:
                patch = {"status": {"capacity": {GPU: "1"}, "allocatable": {GPU: str(count)}}}
                self.client.patch(NodeStatus, self.node, patch, patch_type=PatchType.MERGE)
                self._last = count

    def __enter__(self) -> NodeStatusMirror:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class Sampler:
    """The Node's allocatable and the node's slices, every 0.1 s."""

    def __init__(self, client: Any, node: str) -> None:
        self.client, self.node = client, node
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            allocatable = int(get_node_allocatable(self.client, self.node).get(GPU, "0"))
            devices = sum(len(s["spec"].get("devices") or []) for s in
                          list_slices(self.client, node=self.node, driver=DRIVER))
            self.samples.append(Sample(time.monotonic(), allocatable, devices))

    def since(self, start: float) -> list[Sample]:
        return [s for s in self.samples if s.at >= start]

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Node:
    name: str
    plane: ControlPlane
    kubelet: KubeletSim
    plugin: Daemon
    dra: Daemon
    sampler: Sampler
    namespace: str

    def label(self, entry: str) -> float:
        self.plane.kubectl("label", "node", self.name, f"{LABEL}={entry}", "--overwrite")
        return time.monotonic()

    def advertised(self) -> tuple[int, int]:
        """(healthy devices the kubelet has, devices in the node's slices), latest sample."""
        if not self.sampler.samples:
            return -1, -1
        latest = self.sampler.samples[-1]
        return latest.allocatable, latest.devices

    def wait(self, what: str, check: Callable[[], bool], timeout: float = SWITCH_S) -> float:
        start = time.monotonic()
        while not check():
            for daemon in (self.plugin, self.dra):
                assert daemon.proc.poll() is None, f"{daemon.log_path.name} exited:\n{daemon.log}"
            if time.monotonic() - start > timeout:
                raise AssertionError(f"no {what} within {timeout} s; samples {self.sampler.samples[-5:]}\n"
                                     f"--- plugin\n{self.plugin.log[-4000:]}\n"
                                     f"--- dra\n{self.dra.log[-4000:]}")
            time.sleep(0.1)
        return time.monotonic() - start

    def events(self, reason: str) -> list[dict[str, Any]]:
        out = self.plane.kubectl("get", "events", "-n", "default", "-o", "json", "--field-selector",
                                 f"involvedObject.name={self.name},reason={reason}").stdout
        found: list[dict[str, Any]] = json.loads(out)["items"]
        return found


def never_both(samples: list[Sample]) -> None:
    both = [s for s in samples if s.allocatable > 0 and s.devices > 0]
    assert not both, f"advertised through both APIs: {both}"


def neither(samples: list[Sample]) -> float:
    """How long neither API advertised (from the first such sample to the next one that does)."""
    gaps = [s for s in samples if s.allocatable == 0 and s.devices == 0]
    return gaps[-1].at - gaps[0].at if gaps else 0.0


@pytest.fixture
def node(kube_api: ControlPlane, tmp_path: Path) -> Iterator[Node]:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(name, labels={LABEL: "dp"})
    namespace = f"work-{uuid.uuid4().hex[:8]}"
    kube_api.kubectl("create", "namespace", namespace)
    kube_api.kubectl("-n", namespace, "create", "serviceaccount", "default")
    root = entries_dir(tmp_path, ENTRIES)
    sockets = Path(tempfile.mkdtemp(prefix="nvdp-mode-", dir="/tmp"))
    plugin_dir = tmp_path / "device-plugins"
    client = connect(kube_api.admin_kubeconfig)
    with NodeSim("t4", tmp_path / "nvml") as sim, KubeletSim(plugin_dir) as kubelet, \
            KubeletPodResources(client, name) as pod_resources, \
            NodeStatusMirror(kubelet, client, name), Sampler(client, name) as sampler:
        # Both plugins ask the kubelet's pod-resources API (here answered from the API server's pods)
        # which pods use the GPUs.
        env = {**clean_env(), **sim.env, "CONFIG_DIR": str(root), "DEFAULT_CONFIG": "dp", "NODE_NAME": name,
               "KUBECONFIG": str(kube_api.admin_kubeconfig), "PYTHONUNBUFFERED": "1",
               "KUBELET_POD_RESOURCES_SOCKET": pod_resources.socket_path,
               "DRA_DRIVER_NAME": DRIVER, "NVDP_DEFAULT_MODE": "dra",
               "HEALTH_RECOVERY_AFTER": "1s", "HEALTH_STATE_DIR": str(tmp_path / "health")}
        cdi = make_cdi_node(tmp_path / "cdi-node", sim.inventory)
        plugin = Daemon([sys.executable, "-m", "nvdp.plugin.main"],
                        {**env, "DEVICE_PLUGIN_PATH": str(plugin_dir)}, tmp_path / "plugin.log")
        dra = Daemon([sys.executable, "-m", "nvdp.dra.main"],
                     {**env, **cdi.env, "CDI_ROOT": str(cdi.cdi_dir),
                      "KUBELET_PLUGINS_DIR": str(sockets / "plugins"),
                      "KUBELET_REGISTRAR_DIR": str(sockets / "registry")}, tmp_path / "dra.log")
        try:
            yield Node(name, kube_api, kubelet, plugin, dra, sampler, namespace)
        finally:
            codes = plugin.stop(), dra.stop()
            shutil.rmtree(sockets, ignore_errors=True)
    assert codes == (0, 0), f"--- plugin\n{plugin.log}\n--- dra\n{dra.log}"


def gpu_pod(node: Node, name: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": node.namespace},
           "spec": {"nodeName": node.name, "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {GPU: "1"}}}]}}
    node.plane.kubectl("create", "-f", "-", input_text=json.dumps(pod))


def claim_pod(node: Node, name: str) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"{name}-gpu", "namespace": node.namespace},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}
    node.plane.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    status = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node.name, "device": "gpu-0"}]}}}}
    node.plane.kubectl("-n", node.namespace, "patch", "resourceclaim", f"{name}-gpu", "--subresource=status",
                       "--type=merge", "-p", json.dumps(status))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": node.namespace},
           "spec": {"nodeName": node.name, "automountServiceAccountToken": False,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                    "containers": [{"name": "c", "image": "cuda",
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}
    node.plane.kubectl("create", "-f", "-", input_text=json.dumps(pod))


def in_dp_mode(node: Node) -> bool:
    return node.advertised() == (1, 0)


def in_dra_mode(node: Node) -> bool:
    return node.advertised() == (0, 1)


def test_a_label_switches_the_node_between_the_apis_never_both(node: Node) -> None:
    # 1. start in device-plugin mode
    node.wait("nvidia.com/gpu 1 from the device plugin", lambda: in_dp_mode(node))
    node.dra.wait_for("This node is in device-plugin mode")
    start = time.monotonic()

    # 2. -> dra
    switched = node.label("dra")
    seconds = node.wait("the slice in DRA mode", lambda: in_dra_mode(node))
    node.dra.wait_for("Done waiting for the device plugin to withdraw this node's GPUs")
    node.plugin.wait_for("Advertising nothing: this node is in DRA mode")
    node.wait("a ModeSwitched Event", lambda: bool(node.events("ModeSwitched")))
    (event,) = node.events("ModeSwitched")
    assert (event["type"], event["message"]) == ("Normal", "device-plugin -> dra")
    assert event["source"]["component"] == "nvidia-dra-plugin"
    print(f"device-plugin -> dra in {seconds:.1f} s, "
          f"neither for {neither(node.sampler.since(switched)):.1f} s")

    # 3. -> dp
    switched = node.label("dp")
    seconds = node.wait("nvidia.com/gpu 1 again", lambda: in_dp_mode(node))
    node.plugin.wait_for("Done waiting for the DRA plugin to delete this node's ResourceSlices")
    node.wait("the second ModeSwitched Event", lambda: len(node.events("ModeSwitched")) == 2)
    messages = {e["message"] for e in node.events("ModeSwitched")}
    assert messages == {"device-plugin -> dra", "dra -> device-plugin"}
    print(f"dra -> device-plugin in {seconds:.1f} s, "
          f"neither for {neither(node.sampler.since(switched)):.1f} s")

    # 4. a pod on the device plugin's GPU: the switch waits, then goes in by itself
    gpu_pod(node, "train")
    refused_at = node.label("dra")
    node.wait("a ModeSwitchRefused Event", lambda: bool(node.events("ModeSwitchRefused")), timeout=15)
    (event,) = node.events("ModeSwitchRefused")
    assert event["type"] == "Warning" and event["source"]["component"] == "nvidia-device-plugin"
    assert f"{node.namespace}/train (nvidia.com/gpu)" in event["message"], event["message"]
    assert "the node switches by itself once they are gone" in event["message"]
    node.dra.wait_for("ModeSwitchRefused")  # the DRA plugin refuses too, and only logs it
    time.sleep(12)  # past a retry
    assert all(s == Sample(s.at, 1, 0) for s in node.sampler.since(refused_at)), "the refused switch moved"
    assert len(node.events("ModeSwitchRefused")) == 1
    node.plane.kubectl("-n", node.namespace, "delete", "pod", "train", "--grace-period=0", "--force")
    seconds = node.wait("the switch after the pod went", lambda: in_dra_mode(node))
    print(f"pod deleted -> DRA mode in {seconds:.1f} s")

    # 5. a pod holding a claim on the DRA plugin's GPU: the switch back waits, then goes in
    claim_pod(node, "infer")
    refused_at = node.label("dp")
    node.wait("the DRA plugin's ModeSwitchRefused Event", lambda: len(node.events("ModeSwitchRefused")) == 2,
              timeout=15)
    (event,) = [e for e in node.events("ModeSwitchRefused")
                if e["source"]["component"] == "nvidia-dra-plugin"]
    assert f"{node.namespace}/infer (claim infer-gpu)" in event["message"], event["message"]
    time.sleep(2)
    assert all(s == Sample(s.at, 0, 1) for s in node.sampler.since(refused_at)), "the refused switch moved"
    node.plane.kubectl("-n", node.namespace, "delete", "pod", "infer", "--grace-period=0", "--force")
    # No controller here: the claim stays allocated, and an allocated claim holds the GPU too (its pod
    # may be on its way to the node). Deleted, as the resource claim controller would do.
    time.sleep(12)  # past a retry
    assert in_dra_mode(node), "the switch went in while a claim was still allocated from the node's pool"
    assert "infer-gpu (a claim allocated here, no container on the node holds it yet)" in node.dra.log
    node.plane.kubectl("-n", node.namespace, "delete", "resourceclaim", "infer-gpu")
    node.wait("the switch back after the claim went", lambda: in_dp_mode(node))

    never_both(node.sampler.since(start))
    for daemon in (node.plugin, node.dra):
        assert "Traceback" not in daemon.log, daemon.log


def device_taints(node: Node) -> dict[str, list[dict[str, Any]]]:
    """Each device of the node's slices and its taints, as the API server holds them."""
    out = node.plane.kubectl("get", "resourceslices", "-o", "json").stdout
    return {d["name"]: d.get("taints") or [] for s in json.loads(out)["items"]
            if s["spec"].get("nodeName") == node.name for d in s["spec"].get("devices") or []}


def test_in_dra_mode_a_gpu_that_goes_down_is_tainted_and_comes_back(node: Node, tmp_path: Path) -> None:
    from nvdp.inventory.profile import load_profile
    from sim.nvml import inject_xid, resolve_profile

    uuid = load_profile(resolve_profile("t4")).gpus[0].uuid
    node.wait("nvidia.com/gpu 1 from the device plugin", lambda: in_dp_mode(node))
    node.label("dra")
    node.wait("the slice in DRA mode", lambda: in_dra_mode(node))
    node.dra.wait_for("Health checks:")
    start = time.monotonic()
    inject_xid(tmp_path / "nvml", uuid, 94)
    # The device stays in the slice with NVIDIA's XID taint and nvdp's recovery state (the API server
    # has device taints on): the scheduler keeps claims off it, `kubectl get resourceslice` says why.
    node.wait("gpu-0's XID taint", lambda: {(t["key"], t.get("value"), t["effect"])
                                            for t in device_taints(node).get("gpu-0", [])} >= {
        ("gpu.nvidia.com/xid", "94", "NoSchedule"), ("gpu.nvidia.com/recovery", "recovering", "NoSchedule")})
    node.dra.wait_for(f"{uuid}: XID 94 (contained ECC error); it comes back by itself after 1s")
    record_file = tmp_path / "health" / "health.json"
    node.wait("the health record", lambda: record_file.exists() and uuid in record_file.read_text())
    assert json.loads(record_file.read_text())["writer"] == "nvidia-dra-plugin"
    node.wait("gpu-0's taints removed", lambda: device_taints(node).get("gpu-0") == [])
    assert in_dra_mode(node)
    node.wait("a GPUHealthy Event", lambda: bool(node.events("GPUHealthy")))
    (event,) = node.events("GPUHealthy")
    assert event["source"]["component"] == "nvidia-dra-plugin", event
    never_both(node.sampler.since(start))
