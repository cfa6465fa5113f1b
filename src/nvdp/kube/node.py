"""Read a Node's labels and patch the `nvidia.com/*` ones."""

from __future__ import annotations

from collections.abc import Mapping

from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType
from msgspec import Struct, field

# The only label prefix this project writes; anything else on the Node belongs to someone else.
OWNED_LABEL_PREFIX = "nvidia.com/"


class NodeLabels(Struct, frozen=True):
    """A Node as the watcher sees it: identity, version, labels."""

    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str] = field(default_factory=dict)


def node_labels(node: Node) -> NodeLabels:
    meta = node.metadata
    if meta is None or meta.name is None:
        raise ValueError("API server returned a Node without metadata.name")
    return NodeLabels(name=meta.name, uid=meta.uid or "", resource_version=meta.resourceVersion or "",
                      labels=dict(meta.labels or {}))


def get_node_labels(client: Client, name: str) -> NodeLabels:
    return node_labels(client.get(Node, name=name))


def list_node(client: Client, name: str) -> tuple[NodeLabels, str]:
    """The Node (by name) and the list's resourceVersion, the point to start a watch from.

    A missing Node raises lightkube's ApiError with code 404, like a GET would.
    """
    from lightkube.core.exceptions import ApiError
    from lightkube.models.meta_v1 import Status

    found = client.list(Node, fields={"metadata.name": name})
    nodes = [node_labels(n) for n in found]
    if not nodes:
        raise ApiError(status=Status(code=404, reason="NotFound", message=f'nodes "{name}" not found'))
    return nodes[0], found.resourceVersion


def get_node_allocatable(client: Client, name: str) -> dict[str, str]:
    """The Node's status.allocatable (resource name -> quantity, as the kubelet last reported it)."""
    status = client.get(Node, name=name).status
    return dict(status.allocatable or {}) if status is not None else {}


def patch_node_labels(client: Client, name: str, labels: Mapping[str, str | None]) -> NodeLabels:
    """Set labels (value) or remove them (None) in one merge patch; only `nvidia.com/*` keys are allowed."""
    foreign = sorted(key for key in labels if not key.startswith(OWNED_LABEL_PREFIX))
    if foreign:
        raise ValueError(f"refusing to patch labels outside {OWNED_LABEL_PREFIX}: {', '.join(foreign)}")
    patch = {"metadata": {"labels": dict(labels)}}
    return node_labels(client.patch(Node, name, patch, patch_type=PatchType.MERGE))


def get_configmap_data(client: Client, namespace: str, name: str) -> dict[str, str]:
    """A ConfigMap's text entries (what the chart mounts as the entries directory)."""
    from lightkube.resources.core_v1 import ConfigMap

    return dict(client.get(ConfigMap, name=name, namespace=namespace).data or {})
