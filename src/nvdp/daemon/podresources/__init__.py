"""The kubelet's pod-resources API (v1 List): which pods this node runs, the devices of their
device-plugin resources and the ResourceClaims their containers hold, asked on the node's own socket.

Every daemon that must know which pods use the node's GPUs asks here rather than listing pods through
the API server: the DRA plugin before it releases a claim (`client.claims_in_use`), and every daemon
before a per-node mode switch (`client.node_pods`, through `kubelet_pods`). The answer is local to the
node and carries no pod spec or environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nvdp.daemon.pernode.mode import KubeletPod, KubeletPods

# Where the chart tells a daemon the socket is (mounted read-only from the node).
POD_RESOURCES_ENV = "KUBELET_POD_RESOURCES_SOCKET"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def kubelet_pods(socket_path: str) -> KubeletPods:
    """The mode policy's view of the node's pods, asked of the kubelet at `socket_path` on each call."""

    def pods() -> Sequence[KubeletPod]:
        from nvdp.daemon.podresources.client import node_pods

        return node_pods(socket_path)

    return pods


def kubelet_pods_from(env: Mapping[str, str]) -> KubeletPods | None:
    """The pods from the kubelet's socket at env KUBELET_POD_RESOURCES_SOCKET (the chart sets it and
    mounts the socket wherever a daemon follows the per-node mode); None when unset, and the pods bound
    to the node are then listed through the API server."""
    socket_path = env.get(POD_RESOURCES_ENV, "").strip()
    return kubelet_pods(socket_path) if socket_path else None
