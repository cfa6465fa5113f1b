"""The Events of a running nvidia-dra-plugin, on a real kube-apiserver: a claim config for a mistyped
driver name is one Warning Event on the claim however often the kubelet retries, and publishing refused
until RBAC allows it is one Warning Event on the Node for the whole run of retries.

The plugin runs unmodified on the stand-in NVML; the test plays the kubelet's DRA manager on its socket.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from sim.nvml import NodeSim
from tests.kube.envtest import ControlPlane

from .cdi_node import make_cdi_node
from .conftest import clean_env
from .test_dra_metrics import call
from .test_node_config_rule import Daemon

pytestmark = pytest.mark.slow
DRIVER = "gpu.nvidia.com"
PARAMS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
          "sharing": {"strategy": "TimeSlicing"}}


def run_plugin(plane: ControlPlane, node: str, tmp_path: Path, folder: Path, sim: NodeSim,
               kubeconfig: Path | None = None, extra: dict[str, str] | None = None) -> Daemon:
    cdi = make_cdi_node(tmp_path / "cdi-node", sim.inventory)
    env = {**clean_env(), **sim.env, **cdi.env, "NODE_NAME": node, "PYTHONUNBUFFERED": "1",
           "KUBECONFIG": str(kubeconfig or plane.admin_kubeconfig), "CDI_ROOT": str(cdi.cdi_dir),
           "KUBELET_PLUGINS_DIR": str(folder / "plugins"), "KUBELET_REGISTRAR_DIR": str(folder / "registry"),
           "NVDP_DEFAULT_MODE": "dra", **(extra or {})}
    return Daemon([sys.executable, "-m", "nvdp.dra.main"], env, tmp_path / "dra.log")


def events(plane: ControlPlane, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    found = plane.kubectl("get", "events", "-n", namespace, "-o", "json", "--field-selector",
                          f"involvedObject.name={name},reason={reason}").stdout
    return list(json.loads(found)["items"])


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        time.sleep(0.1)


def recorded(plane: ControlPlane, claim: str) -> bool:
    return bool(events(plane, "default", claim, "ClaimConfigDriverMismatch"))


def mistyped_claim(plane: ControlPlane, node: str, name: str, *, mps: bool = False) -> str:
    """A claim allocated gpu-0 of `node`'s pool whose TimeSlicing config names `gpu.nvidia.co` (`mps`:
    and an MPS config naming the driver rightly); its uid."""
    configs = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.co", "parameters": PARAMS}}]
    if mps:
        configs.append({"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
            **PARAMS, "sharing": {"strategy": "MPS"}}}})
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                                  "config": configs}}}
    plane.kubectl("create", "-f", "-", input_text=json.dumps(claim))
    status = {"status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"}],
        "config": [{"source": "FromClaim", **config} for config in configs]}}}}
    plane.kubectl("-n", "default", "patch", "resourceclaim", name, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))
    found = plane.kubectl("-n", "default", "get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid}")
    return found.stdout


def test_a_mistyped_config_driver_is_one_event_on_the_claim(kube_api: ControlPlane, tmp_path: Path,
                                                            sockets: Path) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node)
    with NodeSim("t4", tmp_path / "nvml") as sim:
        daemon = run_plugin(kube_api, node, tmp_path, sockets, sim)
        try:
            daemon.wait_for("Registration socket for")
            socket = str(sockets / "plugins" / DRIVER / "dra.sock")
            first, second = f"typo-{uuid.uuid4().hex[:6]}", f"typo-{uuid.uuid4().hex[:6]}"
            uid = mistyped_claim(kube_api, node, first)
            answer = call(socket, "NodePrepareResources", (first, uid))
            assert not answer.claims[uid].error, answer  # prepared, without the ignored config
            assert not call(socket, "NodeUnprepareResources", (first, uid)).claims[uid].error
            # A second claim asks for MPS too, which this plugin runs without (no MPS root): refused
            # after its config was read, each time the kubelet retries.
            other = mistyped_claim(kube_api, node, second, mps=True)
            for _ in range(3):
                assert "MPS" in call(socket, "NodePrepareResources", (second, other)).claims[other].error
            for name in (first, second):
                eventually(partial(recorded, kube_api, name), f"the Event on claim {name}")
            time.sleep(1)  # any further Event would be written by now
            for name, claim_uid in ((first, uid), (second, other)):
                (event,) = events(kube_api, "default", name, "ClaimConfigDriverMismatch")
                assert event["type"] == "Warning" and event["involvedObject"]["uid"] == claim_uid
                assert event["source"]["component"] == "nvidia-dra-plugin"
                assert "spec.devices.config[0].opaque.driver is 'gpu.nvidia.co'" in event["message"]
        finally:
            code = daemon.stop()
    assert code == 0, daemon.log


def role(name: str, slice_verbs: list[str]) -> str:
    """What the plugin needs, with `slice_verbs` on ResourceSlices."""
    rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
              "verbs": ["get", "list", "watch"]},
             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": slice_verbs}]
    return json.dumps({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "metadata": {"name": name}, "rules": rules})


def test_publishing_refused_until_rbac_allows_it_is_one_event_on_the_node(
        kube_api: ControlPlane, tmp_path: Path, sockets: Path) -> None:
    node, account = f"gpu-{uuid.uuid4().hex[:8]}", f"dra-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node)
    kubeconfig = kube_api.service_account_kubeconfig("default", account)
    kube_api.apply(role(account, ["get", "list", "watch"]))  # slices may be read, not written
    kube_api.kubectl("create", "clusterrolebinding", account, f"--clusterrole={account}",
                     f"--serviceaccount=default:{account}")
    with NodeSim("t4", tmp_path / "nvml") as sim:
        daemon = run_plugin(kube_api, node, tmp_path, sockets, sim, kubeconfig)
        try:
            # Every publish is refused (403), tried again every 10 s: one Event for them all.
            daemon.wait_for("Cannot publish this node's ResourceSlices", count=2, timeout=40)
            kube_api.apply(role(account, ["get", "list", "watch", "create", "update", "delete"]))
            eventually(lambda: f"{node}-{DRIVER}-0" in kube_api.kubectl(
                "get", "resourceslices", "--field-selector", f"spec.nodeName={node}", "-o", "name").stdout,
                "the slice published once RBAC allows it", timeout_s=30)
            found = events(kube_api, "default", node, "ResourceSlicePublishFailed")
            assert len(found) == 1, [e["message"] for e in found]
            assert found[0]["type"] == "Warning" and found[0]["involvedObject"]["kind"] == "Node"
            assert found[0]["source"]["component"] == "nvidia-dra-plugin"
            assert "403" in found[0]["message"] and "ClusterRole" in found[0]["message"]
        finally:
            code = daemon.stop()
    assert code == 0, daemon.log


def test_dynamic_mig_without_the_scheduler_fix_is_one_warning_and_one_event_per_start(
        kube_api: ControlPlane, tmp_path: Path, sockets: Path) -> None:
    """The throwaway kube-apiserver is the kit's, v1.36.2: older than the scheduler fix (1.37.0)."""
    import signal

    from nvdp.dra.pool.scale import SCALE_EVENT, scale_warning

    node = f"gpu-{uuid.uuid4().hex[:8]}"
    kube_api.create_node(node)
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: dynamic\n  mode: dra\n")
    message = scale_warning("v1.36.2", (1, 36, 2), 26)
    assert message is not None
    with NodeSim("h100-mig-dynamic", tmp_path / "nvml") as sim:
        for start in (1, 2):
            (tmp_path / f"start-{start}").mkdir()
            daemon = run_plugin(kube_api, node, tmp_path / f"start-{start}", sockets, sim,
                                extra={"CONFIG_FILE": str(config)})
            try:
                daemon.wait_for("Registration socket for")
                daemon.wait_for(message)
                daemon.proc.send_signal(signal.SIGHUP)  # the same start: read again, not warned again
                daemon.wait_for("reloading the configuration")
                daemon.wait_for("Devices: ", count=2)
                eventually(partial(lambda n: len(events(kube_api, "default", node, SCALE_EVENT)) == n, start),
                           f"the Event of start {start}")
                time.sleep(1)  # any further Event or log line would be written by now
                assert daemon.log.count(message) == 1, daemon.log
                assert "WARNING" in daemon.log.split(message)[0].splitlines()[-1]
            finally:
                code = daemon.stop()
            assert code == 0, daemon.log
    found = events(kube_api, "default", node, SCALE_EVENT)
    assert len(found) == 2 and all(e["message"] == message and e["type"] == "Warning" for e in found)
    assert {e["involvedObject"]["kind"] for e in found} == {"Node"}
    assert {e["source"]["component"] for e in found} == {"nvidia-dra-plugin"}
