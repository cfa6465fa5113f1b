"""The only code that talks to the Kubernetes API server.

`connect` builds a client (in-cluster service account, else `KUBECONFIG`); `NodeWatcher` follows one
Node's labels; `EventRecorder` records Events on it; `patch_node_labels` sets or clears `nvidia.com/*`
labels. Everything above this package sees plain dicts and strings, never client objects.
"""

from nvdp.kube.connect import KubeConnectError, connect
from nvdp.kube.errors import ApiFailure, classify, server_address
from nvdp.kube.events import EventRecorder
from nvdp.kube.node import NodeLabels, get_configmap_data, get_node_labels, patch_node_labels
from nvdp.kube.watch import Backoff, NodeWatcher

__all__ = [
    "ApiFailure",
    "Backoff",
    "EventRecorder",
    "KubeConnectError",
    "NodeLabels",
    "NodeWatcher",
    "classify",
    "connect",
    "get_configmap_data",
    "get_node_labels",
    "patch_node_labels",
    "server_address",
]
