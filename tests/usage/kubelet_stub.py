"""A kubelet's pod-resources API (v1 List) answering what a test says, on a unix socket; and the pods,
containers and claims of its answer."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.podresources.api import podresources_v1_pb2 as pb
from nvdp.daemon.podresources.api import podresources_v1_pb2_grpc as _pb_grpc

pb_grpc: Any = _pb_grpc


class Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.answer = pb.ListPodResourcesResponse()

    def List(self, request: Any, context: Any) -> pb.ListPodResourcesResponse:
        return self.answer

    def holds(self, *pods: pb.PodResources) -> None:
        self.answer = pb.ListPodResourcesResponse(pod_resources=list(pods))


@contextmanager
def serving() -> Iterator[tuple[str, Kubelet]]:
    """(socket path, the kubelet) while serving; the path is short, as a unix socket's must be."""
    with tempfile.TemporaryDirectory(prefix="nvdp-usage-") as tmp:
        servicer = Kubelet()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
        path = f"{tmp}/kubelet.sock"
        assert server.add_insecure_port(f"unix://{path}") == 1
        server.start()
        try:
            yield path, servicer
        finally:
            server.stop(None).wait()


def pod(name: str, *containers: pb.ContainerResources, namespace: str = "team") -> pb.PodResources:
    return pb.PodResources(name=name, namespace=namespace, containers=list(containers))


def devices(container: str, resource: str, *ids: str) -> pb.ContainerResources:
    return pb.ContainerResources(name=container, devices=[pb.ContainerDevices(resource_name=resource,
                                                                              device_ids=list(ids))])


def claim(container: str, name: str, device: str, namespace: str = "team") -> pb.ContainerResources:
    return pb.ContainerResources(name=container, dynamic_resources=[pb.DynamicResource(
        claim_name=name, claim_namespace=namespace, claim_resources=[pb.ClaimResource(
            driver_name="gpu.nvidia.com", pool_name="node-a", device_name=device)])])
