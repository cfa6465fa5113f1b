"""A stand-in for the kubelet's pod-resources API (v1 List) for tests without a kubelet: it answers from
the API server, as a kubelet would for the pods bound to its node.

Each pod bound to the node and not finished is listed; a container gets a device for each
`nvidia.com/*`-style extended resource it asks for (any resource with a "/" outside kubernetes.io),
and, for each claim it names, the claim's allocated devices (driver, pool, device), read from the
claim's status as the kubelet keeps them once prepared. Serve it with `KubeletPodResources(client,
node)` as a context manager; `socket_path` is where the plugins are pointed
(KUBELET_POD_RESOURCES_SOCKET).
"""

from __future__ import annotations

import tempfile
from concurrent import futures
from pathlib import Path
from typing import Any

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.podresources.api import podresources_v1_pb2 as pb
from nvdp.daemon.podresources.api import podresources_v1_pb2_grpc as _pb_grpc
from nvdp.kube import get_claim, list_node_pods

pb_grpc: Any = _pb_grpc
DONE = ("Succeeded", "Failed")


def _claim_name(pod: dict[str, Any], ref: str) -> str | None:
    """The claim a pod's resourceClaims entry `ref` stands for (named, or made from a template)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    for entry in spec.get("resourceClaims") or []:
        if entry.get("name") == ref and entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    for entry in status.get("resourceClaimStatuses") or []:
        if entry.get("name") == ref and entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    return None


def answer(client: Any, node: str) -> pb.ListPodResourcesResponse:
    """What a kubelet on `node` answers List with, from the API server's pods and claims."""
    pods = []
    for pod in list_node_pods(client, node):
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") in DONE:
            continue
        namespace = str(meta.get("namespace", ""))
        containers = []
        for container in spec.get("containers") or []:
            resources = container.get("resources") or {}
            extended = {name: int(v) for name, v in (resources.get("limits") or {}).items()
                        if "/" in name and "kubernetes.io/" not in name and str(v).isdigit()}
            devices = [pb.ContainerDevices(resource_name=name, device_ids=[f"dev-{n}" for n in range(count)])
                       for name, count in extended.items()]
            dynamic = [_dynamic(client, pod, namespace, str(ref.get("name", "")))
                       for ref in resources.get("claims") or []]
            containers.append(pb.ContainerResources(name=container.get("name", ""), devices=devices,
                                                    dynamic_resources=[d for d in dynamic if d is not None]))
        pods.append(pb.PodResources(name=str(meta.get("name", "")), namespace=namespace,
                                    containers=containers))
    return pb.ListPodResourcesResponse(pod_resources=pods)


def _dynamic(client: Any, pod: dict[str, Any], namespace: str, ref: str) -> pb.DynamicResource | None:
    """A container's claim `ref` with its allocated devices; None when it names no claim that exists."""
    name = _claim_name(pod, ref)
    claim = get_claim(client, namespace, name) if name else None
    if claim is None:
        return None
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    return pb.DynamicResource(claim_name=name, claim_namespace=namespace, claim_resources=[
        pb.ClaimResource(driver_name=r["driver"], pool_name=r["pool"], device_name=r["device"])
        for r in results.get("results") or []])


class _Lister(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, client: Any, node: str) -> None:
        self.client, self.node = client, node
        self.calls = 0

    def List(self, request: Any, context: Any) -> pb.ListPodResourcesResponse:
        self.calls += 1
        return answer(self.client, self.node)


class KubeletPodResources:
    """The stand-in's gRPC server on a fresh unix socket (a short path: the limit is about 100 bytes)."""

    def __init__(self, client: Any, node: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="nvdp-podres-")
        self.socket_path = str(Path(self._dir.name) / "kubelet.sock")
        self.lister = _Lister(client, node)
        self._server: Any = None

    def __enter__(self) -> KubeletPodResources:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(self.lister, self._server)
        assert self._server.add_insecure_port(f"unix://{self.socket_path}") == 1
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop(None).wait()
        self._dir.cleanup()
