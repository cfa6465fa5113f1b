"""The only code that talks to the Kubernetes API server.

`connect` builds a client (in-cluster service account, else `KUBECONFIG`); `NodeWatcher` follows one
Node's labels; `EventRecorder` records Events on it (`record_claim_event`: on a ResourceClaim);
`patch_node_labels` sets or clears `nvidia.com/*` labels; `get_node_allocatable` and `list_node_pods`
read what a node advertises and runs (the per-node mode switch, nvdp.daemon.pernode.mode);
`get_server_version` reads the API server's version. Everything above this package sees plain dicts
and strings, never client objects.
"""

from lightkube import Client as KubeClient

from nvdp.kube.claims import apply_device_status, get_claim, list_claims
from nvdp.kube.connect import KubeConnectError, NoApiAccess, connect
from nvdp.kube.errors import ApiFailure, classify, server_address
from nvdp.kube.events import EventRecorder, record_claim_event
from nvdp.kube.node import (
    NodeLabels,
    get_configmap_data,
    get_node_allocatable,
    get_node_labels,
    patch_node_labels,
)
from nvdp.kube.pods import list_node_pods
from nvdp.kube.slices import (
    SliceEvent,
    SliceWatcher,
    create_slice,
    delete_slice,
    get_node_uid,
    list_slices,
    replace_slice,
)
from nvdp.kube.version import ServerVersion, get_server_version
from nvdp.kube.watch import Backoff, ListWatch, NodeWatcher

__all__ = [
    "ApiFailure",
    "Backoff",
    "EventRecorder",
    "KubeClient",
    "KubeConnectError",
    "ListWatch",
    "NoApiAccess",
    "NodeLabels",
    "NodeWatcher",
    "ServerVersion",
    "SliceEvent",
    "SliceWatcher",
    "apply_device_status",
    "classify",
    "connect",
    "create_slice",
    "delete_slice",
    "get_claim",
    "get_configmap_data",
    "get_node_allocatable",
    "get_node_labels",
    "get_node_uid",
    "get_server_version",
    "list_claims",
    "list_node_pods",
    "list_slices",
    "patch_node_labels",
    "record_claim_event",
    "replace_slice",
    "server_address",
]
