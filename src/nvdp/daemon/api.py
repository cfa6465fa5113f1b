"""The process's one API client, and the node reads of the mode policy made with it.

Every daemon that talks to the API server (the slices and claims of the DRA plugin, the labeller's
Node output, the mode policy's reads) uses the client of its `ApiConnection`, made on first use:
a daemon that never needs the API never imports the client (about 200 ms and 11 MiB).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvdp.daemon.pernode.mode import KubeletPods, NodeApi

# What a follower (the labeller, the MPS daemon) logs when it cannot list the node's pods.
PODS_UNREADABLE = "cannot read the pods on this node (%s): a switch to or from DRA mode needs a restart"


class ApiConnection:
    """One client for the whole process (a lightkube Client is safe to share between threads)."""

    def __init__(self, kubeconfig: str | None) -> None:
        self.kubeconfig = kubeconfig
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        """The client; KubeConnectError (with the fix) when there is no usable API configuration."""
        with self._lock:
            if self._client is None:
                from nvdp.kube import connect

                self._client = connect(self.kubeconfig)
            return self._client

    def node_api(self, node: str, driver: str | None, log: logging.Logger, *, all_claims: bool = False,
                 unreachable: str | None = None, kubelet_pods: KubeletPods | None = None) -> NodeApi | None:
        """The mode policy's reads of `node` (nvdp.daemon.pernode.mode.NodeApi; `kubelet_pods`: the pods
        from the kubelet's pod-resources API rather than the API server); None without API access,
        logged as a WARNING with `unreachable` (a format with one %s, the cause) where the daemon says
        so."""
        from nvdp.daemon.pernode.mode import NodeApi
        from nvdp.kube import KubeConnectError

        try:
            return NodeApi(self.client(), node, driver, all_claims=all_claims, kubelet_pods=kubelet_pods)
        except KubeConnectError as err:
            if unreachable is not None:
                log.warning(unreachable, err)
            return None
