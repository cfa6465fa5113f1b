"""The pods bound to one node, as plain dicts (the API's JSON kept whole)."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.generic_resource import GenericNamespacedResource, create_api_info


class _Pod(GenericNamespacedResource):
    # A generic resource, not lightkube's Pod model: fields newer than the installed models (such as
    # status.extendedResourceClaimStatus) come back as the server sent them.
    _api_info = create_api_info("", "v1", "Pod", "pods")


def list_node_pods(client: Client, node: str) -> list[dict[str, Any]]:
    """Every pod bound to `node`, in every namespace (field selector spec.nodeName: the API server
    answers from its index, not a list of the whole cluster)."""
    return [_plain(obj) for obj in client.list(_Pod, namespace="*", fields={"spec.nodeName": node})]


def _plain(obj: Any) -> dict[str, Any]:
    pod: dict[str, Any] = obj.to_dict()
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    return pod
