"""Which ResourceClaims the node's running containers hold, from the kubelet's pod-resources API (v1).

The DRA plugin may release a prepared claim only once no running container on this node still holds
it: the API server's view (the claim's `status.reservedFor`) can lag the node, and a claim released
under a running container takes its devices away from it. The kubelet knows: its `PodResourcesLister`
service (`List`, on `/var/lib/kubelet/pod-resources/kubelet.sock`) names, per running container, the
claims it uses (`dynamic_resources`). `claims_in_use` makes one such call; `held_by_pods` picks the
uses of one claim out of the answer. A pod being deleted stays listed, claims included, until its
containers have stopped (seen on kubelet 1.36.2 with a container that outlasts its grace period).

The same answer says which container holds which device (`container_holds`, for the usage metrics of
nvdp.usage: device-plugin device IDs by resource, and each claim's devices), and which pods use the
node's GPUs before a mode switch (`node_pods`, read by
nvdp.daemon.pernode.mode through nvdp.daemon.podresources.kubelet_pods): the devices of device-plugin
resources (`devices`, `nvidia.com/gpu` ...) and the claims with the driver and pool of each device. The
kubelet lists the pods it has admitted and not finished (its active pods; regular containers and
restartable init containers), so nothing cluster-wide is read and no pod's spec or environment is seen.

The kubelet fills `dynamic_resources` only with its `KubeletPodResourcesDynamicResources` feature gate
on: alpha and off by default in 1.27-1.33, beta and on by default since 1.34 (Kubernetes'
`pkg/features/kube_features.go`; the feature-gate reference agrees). A kubelet with the gate off answers
List normally but leaves the field out, so its answer reads exactly like a node whose containers hold no
claims. Nothing on the wire tells the two apart; this module does not guess, and a caller that must be
sure has to know the kubelet's version and gates some other way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from nvdp.daemon.grpc_import import grpc
from nvdp.daemon.pernode.mode import KubeletClaim, KubeletPod
from nvdp.daemon.podresources import POD_RESOURCES_ENV as POD_RESOURCES_ENV
from nvdp.daemon.podresources import POD_RESOURCES_SOCKET as POD_RESOURCES_SOCKET
from nvdp.daemon.podresources.api import podresources_v1_pb2 as pb
from nvdp.daemon.podresources.api import podresources_v1_pb2_grpc as _pb_grpc

# The generated service module has no type hints.
pb_grpc: Any = _pb_grpc

# A busy node's answer can pass gRPC's default 4 MiB limit; Kubernetes' node tests and the usual
# pod-resources clients (monitoring agents) allow 16 MiB.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_FIX = (
    "mount the kubelet's /var/lib/kubelet/pod-resources into the plugin at the same path, and run a "
    "kubelet of 1.34 or later (its KubeletPodResourcesDynamicResources gate is on by default there; "
    "on 1.27-1.33 it must be switched on)"
)


class ClaimUse(msgspec.Struct, frozen=True):
    """One running container that holds one claim."""

    namespace: str  # the claim's
    name: str  # the claim's
    pod_namespace: str
    pod_name: str
    container: str


class HeldClaim(msgspec.Struct, frozen=True):
    """A claim one container holds, with its devices on this node."""

    namespace: str
    name: str
    devices: tuple[tuple[str, str, str], ...]  # (driver, pool, device), in the kubelet's order


class ContainerHold(msgspec.Struct, frozen=True):
    """One running container's devices: device-plugin device IDs by resource, and the claims it holds."""

    namespace: str  # the pod's
    pod: str
    container: str
    devices: tuple[tuple[str, tuple[str, ...]], ...]  # (resource name, device IDs)
    claims: tuple[HeldClaim, ...]


class PodResourcesUnavailable(Exception):
    """The kubelet's pod-resources API could not be asked; the message names the socket, why and the fix."""

    def __init__(self, socket_path: str, cause: str) -> None:
        super().__init__(f"cannot ask the kubelet's pod-resources API at {socket_path}: {cause}; {_FIX}")
        self.socket_path = socket_path
        self.cause = cause


def claims_in_use(socket_path: str = POD_RESOURCES_SOCKET, timeout_s: float = 5.0) -> tuple[ClaimUse, ...]:
    """Every (claim, pod, container) the kubelet on `socket_path` reports, in the kubelet's order.

    One List call within `timeout_s`. Any failure raises PodResourcesUnavailable: the caller cannot
    tell "no container holds it" from "could not ask", so it must not release anything then.
    """
    return _uses(_list(socket_path, timeout_s))


def node_pods(socket_path: str = POD_RESOURCES_SOCKET, timeout_s: float = 5.0) -> tuple[KubeletPod, ...]:
    """Every pod the kubelet on `socket_path` runs, with the device-plugin resources its containers were
    given devices of and the claims they hold (each with the driver and pool of its devices), in the
    kubelet's order. One List call within `timeout_s`; any failure raises PodResourcesUnavailable."""
    return _pods(_list(socket_path, timeout_s))


def container_holds(socket_path: str = POD_RESOURCES_SOCKET,
                    timeout_s: float = 5.0) -> tuple[ContainerHold, ...]:
    """Every running container on the node that holds device-plugin devices or claims, in the kubelet's
    order. One List call within `timeout_s`; any failure raises PodResourcesUnavailable."""
    return _holds(_list(socket_path, timeout_s))


def _list(socket_path: str, timeout_s: float) -> pb.ListPodResourcesResponse:
    try:
        # A fresh channel per call and no shared subchannel: a kubelet that re-created its socket
        # must not be reached through a connection still backing off from the old one.
        with grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.use_local_subchannel_pool", 1),
                     ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
        ) as channel:
            # No wait_for_ready: a missing socket or a refused connection fails at once (UNAVAILABLE)
            # rather than using up the whole deadline.
            answer: pb.ListPodResourcesResponse = pb_grpc.PodResourcesListerStub(channel).List(
                pb.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as err:
        raise PodResourcesUnavailable(socket_path, _cause(err, timeout_s)) from err
    return answer


def held_by_pods(uses: Iterable[ClaimUse], namespace: str, name: str) -> tuple[ClaimUse, ...]:
    """The uses of claim `namespace`/`name` among `uses` (empty: no running container holds it)."""
    return tuple(use for use in uses if use.namespace == namespace and use.name == name)


def _uses(answer: pb.ListPodResourcesResponse) -> tuple[ClaimUse, ...]:
    uses: dict[ClaimUse, None] = {}  # ordered, and each use once
    for pod in answer.pod_resources:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                uses[ClaimUse(
                    # A pod can only reference claims of its own namespace, so an empty field means that one.
                    namespace=claim.claim_namespace or pod.namespace,
                    name=claim.claim_name,
                    pod_namespace=pod.namespace,
                    pod_name=pod.name,
                    container=container.name,
                )] = None
    return tuple(uses)


def _pods(answer: pb.ListPodResourcesResponse) -> tuple[KubeletPod, ...]:
    pods: list[KubeletPod] = []
    for pod in answer.pod_resources:
        resources: dict[str, None] = {}
        claims: dict[tuple[str, str], dict[tuple[str, str], None]] = {}
        for container in pod.containers:
            for devices in container.devices:
                if devices.device_ids:
                    resources[devices.resource_name] = None
            for claim in container.dynamic_resources:
                key = (claim.claim_namespace or pod.namespace, claim.claim_name)
                held = claims.setdefault(key, {})
                for resource in claim.claim_resources:
                    held[(resource.driver_name, resource.pool_name)] = None
        pods.append(KubeletPod(
            namespace=pod.namespace, name=pod.name, resources=tuple(resources),
            claims=tuple(KubeletClaim(namespace=ns, name=name, devices=tuple(held))
                         for (ns, name), held in claims.items())))
    return tuple(pods)


def _holds(answer: pb.ListPodResourcesResponse) -> tuple[ContainerHold, ...]:
    holds: list[ContainerHold] = []
    for pod in answer.pod_resources:
        for container in pod.containers:
            devices = tuple((d.resource_name, tuple(d.device_ids)) for d in container.devices if d.device_ids)
            claims = tuple(HeldClaim(
                namespace=claim.claim_namespace or pod.namespace, name=claim.claim_name,
                devices=tuple((r.driver_name, r.pool_name, r.device_name) for r in claim.claim_resources))
                for claim in container.dynamic_resources)
            if devices or claims:
                holds.append(ContainerHold(namespace=pod.namespace, pod=pod.name, container=container.name,
                                           devices=devices, claims=claims))
    return tuple(holds)


def _cause(err: grpc.RpcError, timeout_s: float) -> str:
    code: grpc.StatusCode = err.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the kubelet did not answer List within {timeout_s:g}s"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"nothing answers there (no socket, or the kubelet is not running): {err.details()}"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"the kubelet does not serve v1.PodResourcesLister/List: {err.details()}"
    return f"List failed: {code.name}: {err.details()}"
