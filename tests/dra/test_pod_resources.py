"""claims_in_use against a gRPC server on a unix socket that serves the kubelet's v1.PodResourcesLister."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.podresources.api import podresources_v1_pb2 as pb
from nvdp.daemon.podresources.api import podresources_v1_pb2_grpc as pb_grpc
from nvdp.daemon.podresources.client import (
    POD_RESOURCES_SOCKET,
    ClaimUse,
    PodResourcesUnavailable,
    claims_in_use,
    held_by_pods,
)


def _claim(name: str, namespace: str, *devices: str) -> pb.DynamicResource:
    return pb.DynamicResource(
        claim_name=name, claim_namespace=namespace,
        claim_resources=[pb.ClaimResource(cdi_devices=[pb.CDIDevice(name=f"k8s.gpu.nvidia.com/claim={d}")],
                                          driver_name="gpu.nvidia.com", pool_name="node-a", device_name=d)
                         for d in devices])


SHARED = _claim("shared", "team-b", "gpu-1", "gpu-2")

# What a kubelet with the gate on answers for: a pod with a claim in one of two containers (the other
# has a device-plugin GPU), a pod whose two containers share one claim and one of them has a second,
# a pod without claims, and a pod with no containers listed.
NODE = pb.ListPodResourcesResponse(pod_resources=[
    pb.PodResources(name="train-0", namespace="team-a", containers=[
        pb.ContainerResources(name="main", dynamic_resources=[_claim("train-0-gpu", "team-a", "gpu-0")]),
        pb.ContainerResources(name="exporter", cpu_ids=[2, 3], devices=[pb.ContainerDevices(
            resource_name="nvidia.com/gpu", device_ids=["GPU-1"],
            topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)]))]),
    ]),
    pb.PodResources(name="infer", namespace="team-b", containers=[
        pb.ContainerResources(name="server", dynamic_resources=[SHARED]),
        pb.ContainerResources(name="warmup",
                              dynamic_resources=[SHARED, _claim("scratch", "team-b", "gpu-3")]),
    ]),
    pb.PodResources(name="web", namespace="team-a", containers=[
        pb.ContainerResources(name="nginx", memory=[pb.ContainerMemory(memory_type="memory", size=1 << 20)]),
    ]),
    pb.PodResources(name="empty", namespace="kube-system"),
])


class Lister(pb_grpc.PodResourcesListerServicer):
    """Answers List with `answer`; with `hold` set, first waits until it is released."""

    def __init__(self, answer: pb.ListPodResourcesResponse) -> None:
        self.answer = answer
        self.calls = 0
        self.hold: threading.Event | None = None

    def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.hold is not None:
            self.hold.wait(10)
        return self.answer


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # A unix socket path must stay under ~100 bytes, which pytest's tmp_path can pass.
    with tempfile.TemporaryDirectory(prefix="nvdp-podres-") as tmp:
        yield Path(tmp)


def serve(path: Path, servicer: Any) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    assert server.add_insecure_port(f"unix://{path}") == 1
    server.start()
    return server


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[tuple[str, Lister]]:
    lister = Lister(NODE)
    server = serve(sock_dir / "kubelet.sock", lister)
    yield str(sock_dir / "kubelet.sock"), lister
    if lister.hold is not None:
        lister.hold.set()
    server.stop(None).wait()


def test_default_socket_is_the_kubelets() -> None:
    assert POD_RESOURCES_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_every_claim_maps_to_its_pod_and_container(kubelet: tuple[str, Lister]) -> None:
    path, lister = kubelet
    uses = claims_in_use(path)
    assert uses == (
        ClaimUse(namespace="team-a", name="train-0-gpu", pod_namespace="team-a", pod_name="train-0",
                 container="main"),
        ClaimUse(namespace="team-b", name="shared", pod_namespace="team-b", pod_name="infer",
                 container="server"),
        ClaimUse(namespace="team-b", name="shared", pod_namespace="team-b", pod_name="infer",
                 container="warmup"),
        ClaimUse(namespace="team-b", name="scratch", pod_namespace="team-b", pod_name="infer",
                 container="warmup"),
    )
    assert lister.calls == 1  # one List per call


def test_held_by_pods_picks_one_claims_uses(kubelet: tuple[str, Lister]) -> None:
    uses = claims_in_use(kubelet[0])
    assert [(u.pod_name, u.container) for u in held_by_pods(uses, "team-b", "shared")] == [
        ("infer", "server"), ("infer", "warmup")]
    assert [u.container for u in held_by_pods(uses, "team-a", "train-0-gpu")] == ["main"]
    # Same name in another namespace, or a claim nobody holds: nothing.
    assert held_by_pods(uses, "team-a", "shared") == ()
    assert held_by_pods(uses, "team-b", "gone") == ()
    assert held_by_pods((), "team-b", "shared") == ()


def test_a_claim_without_namespace_is_in_its_pods(kubelet: tuple[str, Lister]) -> None:
    path, lister = kubelet
    lister.answer = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(
        name="p", namespace="ns", containers=[pb.ContainerResources(
            name="c", dynamic_resources=[pb.DynamicResource(claim_name="x")])])])
    assert claims_in_use(path) == (ClaimUse("ns", "x", "ns", "p", "c"),)


def test_no_dynamic_resources_reads_as_no_claims(kubelet: tuple[str, Lister]) -> None:
    # What a kubelet with KubeletPodResourcesDynamicResources off answers: indistinguishable from a
    # node without claims, so the module reports nothing and documents the limit.
    path, lister = kubelet
    lister.answer = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(
        name="p", namespace="ns", containers=[pb.ContainerResources(name="c")])])
    assert claims_in_use(path) == ()
    lister.answer = pb.ListPodResourcesResponse()
    assert claims_in_use(path) == ()


def _unavailable(path: str, timeout_s: float = 5.0) -> PodResourcesUnavailable:
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable) as caught:
        claims_in_use(path, timeout_s=timeout_s)
    assert time.monotonic() - started < timeout_s + 2
    message = str(caught.value)
    assert path in message
    assert "/var/lib/kubelet/pod-resources" in message and "1.34" in message  # the fix
    assert caught.value.socket_path == path
    return caught.value


def test_no_socket(sock_dir: Path) -> None:
    started = time.monotonic()
    err = _unavailable(str(sock_dir / "kubelet.sock"))
    assert time.monotonic() - started < 2  # fails at once, not at the deadline
    assert "nothing answers there" in err.cause


def test_socket_file_with_nobody_listening(sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))  # left behind, never listening: connections are refused
    assert path.exists()
    assert "nothing answers there" in _unavailable(str(path)).cause


def test_unimplemented(sock_dir: Path) -> None:
    # The generated servicer's List answers UNIMPLEMENTED.
    server = serve(sock_dir / "kubelet.sock", pb_grpc.PodResourcesListerServicer())
    try:
        err = _unavailable(str(sock_dir / "kubelet.sock"))
    finally:
        server.stop(None).wait()
    assert "does not serve v1.PodResourcesLister/List" in err.cause
    assert isinstance(err.__cause__, grpc.RpcError)
    assert err.__cause__.code() == grpc.StatusCode.UNIMPLEMENTED


def test_deadline(kubelet: tuple[str, Lister]) -> None:
    path, lister = kubelet
    lister.hold = threading.Event()
    err = _unavailable(path, timeout_s=0.3)
    assert "did not answer List within 0.3s" in err.cause


def test_other_errors_name_the_code(sock_dir: Path) -> None:
    class Throttled(pb_grpc.PodResourcesListerServicer):
        def List(self, request: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limited")

    server = serve(sock_dir / "kubelet.sock", Throttled())
    try:
        err = _unavailable(str(sock_dir / "kubelet.sock"))
    finally:
        server.stop(None).wait()
    assert err.cause == "List failed: RESOURCE_EXHAUSTED: rate limited"


def _field_numbers(message: Any) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


def test_wire_layout_matches_the_kubelet_api() -> None:
    # k8s.io/kubelet pkg/apis/podresources/v1/api.proto: what the kubelet puts on the wire.
    assert pb.DESCRIPTOR.package == "v1"
    assert [m.name for m in pb.DESCRIPTOR.services_by_name["PodResourcesLister"].methods] == ["List"]
    assert pb.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"
    assert _field_numbers(pb.ListPodResourcesRequest) == {}
    assert _field_numbers(pb.ListPodResourcesResponse) == {"pod_resources": 1}
    assert _field_numbers(pb.PodResources) == {"name": 1, "namespace": 2, "containers": 3}
    assert _field_numbers(pb.ContainerResources) == {
        "name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5}
    assert _field_numbers(pb.ContainerMemory) == {"memory_type": 1, "size": 2, "topology": 3}
    assert _field_numbers(pb.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert _field_numbers(pb.TopologyInfo) == {"nodes": 1}
    assert _field_numbers(pb.NUMANode) == {"ID": 1}
    assert _field_numbers(pb.DynamicResource) == {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}
    assert _field_numbers(pb.ClaimResource) == {
        "cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5}
    assert _field_numbers(pb.CDIDevice) == {"name": 1}
