"""This node's ResourceSlices (resource.k8s.io/v1) as plain dicts: list, create, replace, delete, watch.

Objects travel as the API's own JSON (a generic resource, not lightkube's model), so every field the
server sends comes back unchanged on replace, including ones newer than the installed models.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import GenericGlobalResource, create_api_info
from msgspec import Struct

from nvdp.kube.watch import WATCH_TIMEOUT_RANGE_S, Backoff, ListWatch

log = logging.getLogger("nvdp.kube")

SLICE_API_VERSION = "resource.k8s.io/v1"


class _ResourceSlice(GenericGlobalResource):
    # Not put in lightkube's resource registry, where it would clash with the model class of the
    # same kind that `codecs` loads.
    _api_info = create_api_info("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")


def _fields(node: str, driver: str) -> dict[str, Any]:
    # Both are field selectors the API server indexes for ResourceSlices: no list of the whole cluster.
    return {"spec.nodeName": node, "spec.driver": driver}


def _plain(obj: Any) -> dict[str, Any]:
    found: dict[str, Any] = obj.to_dict()
    found.setdefault("apiVersion", SLICE_API_VERSION)
    found.setdefault("kind", "ResourceSlice")
    return found


def list_slices_at(client: Client, *, node: str, driver: str) -> tuple[list[dict[str, Any]], str]:
    """This node's slices of `driver`, and the list's resourceVersion (where a watch starts)."""
    found = client.list(_ResourceSlice, fields=_fields(node, driver))
    items = [_plain(obj) for obj in found]
    return items, found.resourceVersion


def list_slices(client: Client, *, node: str, driver: str) -> list[dict[str, Any]]:
    """This node's slices of `driver` (field selectors spec.nodeName and spec.driver)."""
    return list_slices_at(client, node=node, driver=driver)[0]


def create_slice(client: Client, obj: dict[str, Any]) -> dict[str, Any]:
    """Create a ResourceSlice; the server's copy (with uid and resourceVersion) is returned."""
    return _plain(client.create(_ResourceSlice.from_dict(obj)))


def replace_slice(client: Client, obj: dict[str, Any]) -> dict[str, Any]:
    """Replace a ResourceSlice; `obj` carries the metadata.resourceVersion it was read at (409 if stale)."""
    return _plain(client.replace(_ResourceSlice.from_dict(obj)))


def delete_slice(client: Client, name: str) -> None:
    """Delete a ResourceSlice by name; one already gone is fine."""
    try:
        client.delete(_ResourceSlice, name)
    except ApiError as err:
        if err.status.code != 404:
            raise


def get_node_uid(client: Client, node: str) -> str:
    """The Node's uid (for owner references); a missing Node raises ApiError 404."""
    from lightkube.resources.core_v1 import Node

    meta = client.get(Node, name=node).metadata
    if meta is None or not meta.uid:
        raise ValueError(f"API server returned Node {node} without metadata.uid")
    return meta.uid


class SliceEvent(Struct, frozen=True):
    """What the slice watcher saw: "LISTED" (every slice, after each list: start and reconnects), or
    "ADDED" / "MODIFIED" / "DELETED" with the one slice."""

    kind: str
    slices: tuple[dict[str, Any], ...]


class SliceWatcher(ListWatch):
    """Calls `on_change(event)` with this node's slices of `driver` after each list (at start and after
    every reconnect), then with each change. See `ListWatch` for the loop and who closes `client`."""

    def __init__(self, client: Client, *, node: str, driver: str, on_change: Callable[[SliceEvent], None],
                 backoff: Backoff | None = None, owns_client: bool = True,
                 watch_timeout_range_s: tuple[int, int] = WATCH_TIMEOUT_RANGE_S) -> None:
        super().__init__(client, f"resourceslices {node}/{driver}", backoff=backoff,
                         watch_timeout_range_s=watch_timeout_range_s, owns_client=owns_client,
                         keeping="keeping the published slices")
        self.node = node
        self.driver = driver
        self._on_change = on_change
        self.requests = 0  # lists and watch requests sent

    def _list(self) -> str:
        self.requests += 1
        items, version = list_slices_at(self._client, node=self.node, driver=self.driver)
        self._deliver(SliceEvent("LISTED", tuple(items)))
        return version

    def _watch(self, resource_version: str, server_timeout_s: int) -> None:
        self.requests += 1
        events = self._client.watch(_ResourceSlice, fields=_fields(self.node, self.driver),
                                    resource_version=resource_version, server_timeout=server_timeout_s)
        for kind, obj in events:
            if self._stop.is_set():
                return
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._deliver(SliceEvent(kind, (_plain(obj),)))

    def _deliver(self, event: SliceEvent) -> None:
        if self._stop.is_set():
            return
        try:
            self._on_change(event)
        except Exception as err:  # the consumer's bug must not look like an API failure
            log.error("%s: handling a slice change failed: %s: %s", self._what, type(err).__name__, err,
                      exc_info=log.isEnabledFor(logging.DEBUG))
