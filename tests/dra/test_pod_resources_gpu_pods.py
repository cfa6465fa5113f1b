"""Which pods use the node's GPUs, from the kubelet's pod-resources answer (no pod list through the API
server): `node_pods` reads one List answer into plain records, `kubelet_gpu_pods` picks those using
the GPUs (an `nvidia.com/*` device-plugin resource, or a claim with a device of the driver from this
node's pool), and `unheld_claims` the claims allocated here that no container holds yet. The mode
policy (`NodeApi`) asks the kubelet when given its answer, and then never lists pods."""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdp.daemon.pernode.mode import (
    UNHELD,
    KubeletClaim,
    KubeletPod,
    ModeGate,
    ModeSwitchRefused,
    NodeApi,
    kubelet_gpu_pods,
    unheld_claims,
)
from nvdp.daemon.podresources import kubelet_pods_from
from nvdp.daemon.podresources.api import podresources_v1_pb2 as pb
from nvdp.daemon.podresources.client import POD_RESOURCES_ENV, PodResourcesUnavailable, node_pods
from tests.dra.test_pod_resources import Lister, serve

DRIVER = "gpu.nvidia.com"
NODE = "gpu-1"
LOG = logging.getLogger("test.kubelet-pods")


def _claim(name: str, namespace: str, *devices: tuple[str, str, str]) -> pb.DynamicResource:
    """A claim with devices (driver, pool, device)."""
    return pb.DynamicResource(
        claim_name=name, claim_namespace=namespace,
        claim_resources=[pb.ClaimResource(cdi_devices=[pb.CDIDevice(name=f"k8s.{d}/claim={n}")],
                                          driver_name=d, pool_name=p, device_name=n)
                         for d, p, n in devices])


# A node's answer: a device-plugin GPU in one container (CPUs in another), a MIG device, a claim of
# this driver shared by two containers, a claim of another driver, a claim from another node's pool
# (not possible for nvdp's node-local pools, but not ours either), a pod without devices, a device
# entry with no device (a resource the container asked nothing of), and a claim named without its
# namespace.
NODE_ANSWER = pb.ListPodResourcesResponse(pod_resources=[
    pb.PodResources(name="train", namespace="ml", containers=[
        pb.ContainerResources(name="main", devices=[
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1"])]),
        pb.ContainerResources(name="side", cpu_ids=[2], devices=[
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-2"])]),
    ]),
    pb.PodResources(name="mig", namespace="ml", containers=[
        pb.ContainerResources(name="main", devices=[
            pb.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=["MIG-1"]),
            pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["f0"])]),
    ]),
    pb.PodResources(name="infer", namespace="work", containers=[
        pb.ContainerResources(name=c, dynamic_resources=[_claim("infer-gpu", "work", (DRIVER, NODE, "gpu-0"))
                                                          ]) for c in ("a", "b")]),
    pb.PodResources(name="nic", namespace="work", containers=[pb.ContainerResources(
        name="a", dynamic_resources=[_claim("nic", "work", ("net.example.com", NODE, "eth0"))])]),
    pb.PodResources(name="far", namespace="work", containers=[pb.ContainerResources(
        name="a", dynamic_resources=[_claim("far", "work", (DRIVER, "gpu-2", "gpu-0"))])]),
    pb.PodResources(name="web", namespace="web", containers=[pb.ContainerResources(name="nginx")]),
    pb.PodResources(name="idle", namespace="web", containers=[pb.ContainerResources(name="c", devices=[
        pb.ContainerDevices(resource_name="nvidia.com/gpu")])]),
    pb.PodResources(name="bare", namespace="team", containers=[
        pb.ContainerResources(name="c", dynamic_resources=[
            pb.DynamicResource(claim_name="bare-gpu", claim_resources=[
                pb.ClaimResource(driver_name=DRIVER, pool_name=NODE, device_name="gpu-1")])])]),
])


@pytest.fixture
def kubelet() -> Iterator[tuple[str, Lister]]:
    with tempfile.TemporaryDirectory(prefix="nvdp-podres-") as tmp:  # a short unix socket path
        path = str(Path(tmp) / "kubelet.sock")
        lister = Lister(NODE_ANSWER)
        server = serve(Path(path), lister)
        try:
            yield path, lister
        finally:
            server.stop(None).wait()


def test_node_pods_reads_resources_and_claims_of_every_pod(kubelet: tuple[str, Lister]) -> None:
    path, lister = kubelet
    pods = node_pods(path)
    assert lister.calls == 1
    by_name = {p.name: p for p in pods}
    assert [p.name for p in pods] == ["train", "mig", "infer", "nic", "far", "web", "idle", "bare"]
    assert by_name["train"] == KubeletPod("ml", "train", resources=("nvidia.com/gpu",))
    assert by_name["mig"].resources == ("nvidia.com/mig-1g.10gb", "example.com/fpga")
    # One claim held by two containers is one claim.
    assert by_name["infer"].claims == (KubeletClaim("work", "infer-gpu", ((DRIVER, NODE),)),)
    assert by_name["web"] == KubeletPod("web", "web")
    assert by_name["idle"].resources == ()  # named, but no device given
    assert by_name["bare"].claims == (KubeletClaim("team", "bare-gpu", ((DRIVER, NODE),)),)


def test_the_gpu_pods_are_those_with_an_nvidia_resource_or_a_claim_on_this_pool(
        kubelet: tuple[str, Lister]) -> None:
    found = kubelet_gpu_pods(node_pods(kubelet[0]), driver=DRIVER, node=NODE)
    assert [p.describe() for p in found] == [
        "ml/train (nvidia.com/gpu)", "ml/mig (nvidia.com/mig-1g.10gb)", "work/infer (claim infer-gpu)",
        "team/bare (claim bare-gpu)"]
    # Without a driver (no DRA plugin deployed) only device-plugin resources count.
    pods = node_pods(kubelet[0])
    assert [p.name for p in kubelet_gpu_pods(pods, driver=None, node=NODE)] == ["train", "mig"]
    # Another node's pool.
    assert [p.name for p in kubelet_gpu_pods(pods, driver=DRIVER, node="gpu-2")] == ["train", "mig", "far"]


def test_claims_allocated_here_that_no_container_holds() -> None:
    def allocated(namespace: str, name: str, driver: str = DRIVER, pool: str = NODE) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name}, "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": driver, "pool": pool, "device": "gpu-0"}]}}}}

    running = [KubeletPod("work", "infer", claims=(KubeletClaim("work", "infer-gpu", ((DRIVER, NODE),)),))]
    claims = [allocated("work", "infer-gpu"), allocated("work", "late-gpu"), allocated("work", "nic", "n.io"),
              allocated("work", "far", pool="gpu-2"), {"metadata": {"namespace": "work", "name": "pending"}}]
    found = unheld_claims(claims, running, driver=DRIVER, node=NODE)
    assert [p.describe() for p in found] == [f"work/late-gpu ({UNHELD})"]
    assert found[0].pod is False


class _NoClient:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API client was used ({name}): the kubelet answers")


def test_node_api_asks_the_kubelet_and_lists_no_pods(kubelet: tuple[str, Lister]) -> None:
    path, lister = kubelet
    api = NodeApi(_NoClient(), NODE, DRIVER, kubelet_pods=lambda: node_pods(path))
    assert [p.name for p in api.gpu_pods()] == ["train", "mig", "infer", "bare"]
    assert lister.calls == 1


def test_a_kubelet_that_cannot_be_asked_holds_the_switch(tmp_path: Path) -> None:
    missing = str(tmp_path / "kubelet.sock")
    api = NodeApi(_NoClient(), NODE, DRIVER, kubelet_pods=lambda: node_pods(missing, timeout_s=1))
    with pytest.raises(PodResourcesUnavailable):
        api.gpu_pods()
    gate = ModeGate("dra", api, lambda *args, **kwargs: None, LOG)
    gate.enter("dra")
    with pytest.raises(ModeSwitchRefused) as refused:
        gate.check("device-plugin")
    message = str(refused.value)
    assert ("switching this node from dra to device-plugin waits: the pods on the node cannot be "
            "listed") in message
    assert missing in message and "/var/lib/kubelet/pod-resources" in message  # where, and the fix


def test_every_daemon_asks_the_kubelet_where_the_socket_is_given(
        kubelet: tuple[str, Lister], tmp_path: Path) -> None:
    """The device plugin, the labeller and the MPS daemon take the same rule (env
    KUBELET_POD_RESOURCES_SOCKET, which the chart sets): their mode reads ask the kubelet and never list
    a pod through the API."""
    from nvdp.daemon.api import ApiConnection
    from nvdp.daemon.pernode.nodeconfig import NodeConfigSettings
    from nvdp.daemon.skeleton import Skeleton
    from nvdp.gfd.options import ProcessOptions
    from nvdp.gfd.work import GfdWork
    from nvdp.mps.work import MpsDaemonWork
    from nvdp.plugin.work import DevicePluginWork

    assert kubelet_pods_from({}) is None  # the pods bound to the node are then listed through the API
    assert kubelet_pods_from({POD_RESOURCES_ENV: " "}) is None
    env = {POD_RESOURCES_ENV: kubelet[0], "NODE_NAME": NODE, "DRA_DRIVER_NAME": DRIVER}

    def skeleton() -> Skeleton:
        made = Skeleton("test", LOG, env, guard=False)
        connection = ApiConnection(None)
        connection._client = _NoClient()
        made._api = connection
        return made

    per_node = NodeConfigSettings(config_dir=tmp_path, node_name=NODE)
    plugin = DevicePluginWork.__new__(DevicePluginWork)
    plugin.skeleton, plugin.env, plugin.log = skeleton(), env, LOG
    plugin.skeleton.node_config = object()  # type: ignore[assignment]
    opts = ProcessOptions(config_file=None, node_name=NODE, namespace="ns", pod_name="gfd", kubeconfig=None,
                          sysfs_root="/sys", presence_only=False, overrides={}, node_config=per_node)
    labeller = GfdWork(skeleton(), opts, env)
    mps = MpsDaemonWork(skeleton(), argparse.Namespace(), tmp_path, 1.0, per_node)
    for work in (plugin, labeller, mps):
        api = work.mode_api()
        assert api is not None and api.kubelet_pods is not None, work
        assert [p.name for p in api.gpu_pods()][:2] == ["train", "mig"], work
