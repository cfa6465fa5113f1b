"""The label outputs: Node labels, an NFD NodeFeature object, or the features.d file.

Each output knows what it last published and writes only when the wanted set differs from it, so a
node in steady state costs no API writes however often NVML is re-checked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from nvdp.gfd.contest import CONTESTED_BACKOFF_S, ContestedWrites
from nvdp.gfd.labels import TIMESTAMP
from nvdp.gfd.output import read_features_file, remove_features_file, write_features_file
from nvdp.gfd.reconcile import LabelChanges, apply_changes, label_changes

if TYPE_CHECKING:  # the API client is imported only by the outputs that use it
    from lightkube import Client

log = logging.getLogger(__name__)

NODE_FEATURE_PREFIX = "nvidia-features-for"
NFD_NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
# How long a patch's own watch event may take before the Node as watched is trusted again anyway.
ECHO_WAIT_S = 5.0


class Output(Protocol):
    def publish(self, wanted: Mapping[str, str], now: int | None) -> LabelChanges:
        """Bring the published labels to `wanted` (timestamp added when they change); the changes made."""
        ...

    def close(self, keep: bool) -> None:
        """On exit: withdraw what was published unless `keep` (oneshot, infinite sleep)."""
        ...


def _undated(changes: LabelChanges) -> LabelChanges:
    return {k: v for k, v in changes.items() if k != TIMESTAMP}


class NodeOutput:
    """Labels on the Node object itself, compared with the labels the Node carries now.

    `current` is the Node as the watch last delivered it (set_current), never a patch's answer: an
    answer can arrive after the watch has already shown a newer change by someone else, and taking it
    would hide that change until an unrelated one came. Until the watch shows a patch's own result
    (at most ECHO_WAIT_S), the same changes are not sent again. Writes that undo someone else's change
    are paced (`nvdp.gfd.contest`).
    """

    def __init__(self, client: Client, node_name: str, *,
                 contested_backoff_s: tuple[float, float] = CONTESTED_BACKOFF_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._client = client
        self.node_name = node_name
        self._lock = threading.Lock()
        self._current: dict[str, str] | None = None
        self._sent: LabelChanges | None = None  # the last patch, until the watch shows it
        self._sent_at = 0.0
        self._contest = ContestedWrites(node_name, contested_backoff_s)
        self._clock = clock
        self.patches = 0

    def set_current(self, labels: Mapping[str, str]) -> None:
        with self._lock:
            self._current = dict(labels)
            if self._sent is not None and all(labels.get(k) == v for k, v in self._sent.items()):
                self._sent = None

    @property
    def current(self) -> dict[str, str] | None:
        with self._lock:
            return None if self._current is None else dict(self._current)

    def publish(self, wanted: Mapping[str, str], now: int | None) -> LabelChanges:
        from nvdp.kube import patch_node_labels

        at = self._clock()
        with self._lock:
            current = None if self._current is None else dict(self._current)
            sent = self._sent if at - self._sent_at < ECHO_WAIT_S else None
        if current is None:
            raise RuntimeError(f"node {self.node_name}: its labels have not been read yet")
        changes = label_changes(current, wanted, now)
        if not changes or (sent is not None and _undated(changes) == _undated(sent)):
            return {}  # nothing to do, or what the last patch did and the watch has not shown yet
        contested = self._contest.contested(changes)
        if contested and self._contest.wait_s(at) > 0:
            return {}  # a later pass writes them, if they are still wanted then
        patch_node_labels(self._client, self.node_name, changes)
        with self._lock:
            self._sent, self._sent_at = changes, at
        self.patches += 1
        self._contest.wrote(changes, contested, at)
        return changes

    def close(self, keep: bool) -> None:
        """Node labels stay: they describe the node after the labeller stops (as NFD's do)."""


class FileOutput:
    """NFD's local source: `key=value` lines in features.d, rewritten only when they change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._current = read_features_file(path) if path else {}

    def publish(self, wanted: Mapping[str, str], now: int | None) -> LabelChanges:
        changes = label_changes(self._current, wanted, now)
        if changes or not self.path:
            self._current = apply_changes(self._current, changes)
            write_features_file(self.path, self._current)
        return changes

    def close(self, keep: bool) -> None:
        if not keep:
            remove_features_file(self.path)


class NodeFeatureOutput:
    """An NFD NodeFeature object `nvidia-features-for-<node>`; NFD's master applies its labels.

    Each pass reads the object first (one GET; a write only when its labels differ), so an object
    that someone deleted or edited is written again. An update carries the resourceVersion just read:
    when someone changed the object in between, it is refused and the next pass reads it again.
    """

    def __init__(self, client: Client, node_name: str, namespace: str) -> None:
        from lightkube.generic_resource import create_namespaced_resource

        self._client = client
        self.node_name = node_name
        self.namespace = namespace
        self.name = f"{NODE_FEATURE_PREFIX}-{node_name}"
        self._kind = create_namespaced_resource("nfd.k8s-sigs.io", "v1alpha1", "NodeFeature", "nodefeatures")

    def _read(self) -> tuple[dict[str, str], str | None]:
        """The object's labels and resourceVersion; ({}, None) when there is no object."""
        from lightkube.core.exceptions import ApiError

        try:
            obj = self._client.get(self._kind, self.name, namespace=self.namespace)
        except ApiError as e:
            if e.status.code == 404:
                return {}, None
            raise
        spec = obj.get("spec") or {}
        return dict(spec.get("labels") or {}), obj.metadata.resourceVersion if obj.metadata else None

    def publish(self, wanted: Mapping[str, str], now: int | None) -> LabelChanges:
        from lightkube.models.meta_v1 import ObjectMeta

        current, version = self._read()
        changes = label_changes(current, wanted, now)
        if not changes and version is not None:
            return changes
        labels = apply_changes(current, changes)
        obj = self._kind(
            metadata=ObjectMeta(name=self.name, namespace=self.namespace, resourceVersion=version,
                                labels={NFD_NODE_NAME_LABEL: self.node_name}),
            spec={"labels": labels},
        )  # fmt: skip
        if version is None:
            self._client.create(obj)
        else:
            self._client.replace(obj)  # the namespace is in the object
        return changes

    def close(self, keep: bool) -> None:
        """The object stays; NFD keeps the labels until a new labeller replaces them."""
