"""Keep this node's ResourceSlices equal to the devices it serves, writing only what differs.

`publish()` compares the slices the pool should have (`nvdp.dra.pool.slices.desired_slices`) with the ones
the API server holds, by `slice_content` (the spec without the pool generation): nothing differs, no
write. Otherwise obsolete slices are deleted first, then every slice of the pool is written with the
next pool generation (the scheduler uses only the slices of a pool's newest generation, so a pool is
never seen half old, half new). That generation is above every slice found in the pool, within the
API's int64 range: a slice someone else wrote at its top makes the pool start over at 1
(`next_generation`), and a write that fails leaves the next one's generation as it was. While the
watch runs and nothing changed since the last publish, a publish of the same devices sends no request
at all. A publish that fails records the Warning Event `ResourceSlicePublishFailed` on the Node (through
the process's Recorder), once per run of failures: the callers retry, and each retry must not add one.

The watch (`start_watch`) re-publishes the last desired state when someone else deletes or changes
the slices (the kubelet deletes all of a node's slices when it starts) and after every reconnect; the
echoes of this publisher's own writes are recognised and cost nothing.

Device taints: given `taints` (`nvdp.dra.pool.taints.slice_taints`), a down GPU stays in the pool with
its taints instead of leaving it. An API server without the `DRADeviceTaints` gate drops the field
without an error, so every write that carried taints is compared with what the server answered:
taints missing there switch this publisher to leaving down devices out (today's behaviour, written
at once), with one WARNING log line and one Warning Event `DeviceTaintsUnsupported` on the Node.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from nvdp.dra.pool.slices import desired_slices, slice_content, slice_taints_of
from nvdp.kube import (
    SliceEvent,
    SliceWatcher,
    classify,
    create_slice,
    delete_slice,
    get_node_uid,
    list_slices,
    replace_slice,
)

if TYPE_CHECKING:
    from nvdp.dra.pool.devices import DraDevice
    from nvdp.kube import KubeClient

T = TypeVar("T")

# A write refused with 409 Conflict (someone changed a slice between the list and the write) is
# retried from a fresh list this many times in all.
ATTEMPTS = 3
# ResourcePool.generation is an int64: the API server refuses a slice with a larger one.
MAX_GENERATION = 2**63 - 1
# The Warning Event on the Node when the slices cannot be published.
PUBLISH_FAILED = "ResourceSlicePublishFailed"
# The Warning Event on the Node when the API server drops device taints (no DRADeviceTaints gate).
TAINTS_UNSUPPORTED = "DeviceTaintsUnsupported"

Taints = Mapping[str, Sequence[Mapping[str, Any]]]


class EventSink(Protocol):
    """What the publisher records Events with: the process's nvdp.daemon.report.recording.Recorder (Node
    Events)."""

    def event(self, reason: str, message: str, *, warning: bool = True) -> None: ...


class PublishError(Exception):
    """The slices could not be read or written; the message names the request, the cause and the fix."""


def _name(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _version(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def _generation(obj: dict[str, Any]) -> int:
    value = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def next_generation(own: int, listed: Iterable[int]) -> int:
    """The pool generation of the next write: above this publisher's last one and every slice of the
    pool found, so the scheduler takes the new slices over all the old ones; 1 again when that would
    pass the API's int64 range (only a slice someone else wrote can get there: nvdp would need 2**63
    writes). Starting over is safe because every slice of the pool is rewritten, the obsolete ones
    deleted first: until the last write the scheduler sees the old slices only, then the new ones."""
    top = max([own, *listed])
    return top + 1 if top < MAX_GENERATION else 1


class SlicePublisher:
    """Publishes this node's pool of `driver` devices as ResourceSlices; thread-safe."""

    def __init__(self, client: KubeClient, *, node: str, driver: str, log: logging.Logger,
                 recorder: EventSink | None = None) -> None:
        self.node = node
        self.driver = driver
        self._client = client
        self._log = log
        self._recorder = recorder
        self._lock = threading.RLock()
        self._want: tuple[tuple[DraDevice, ...], frozenset[str], Taints | None] | None = None
        self.taints_supported = True  # until the API server drops taints written to it
        self._node_uid: str | None = None
        self._generation = 0
        self._requests = 0
        self._in_sync = False  # the server held the desired slices at the last look, no change seen since
        self._known: list[dict[str, Any]] = []  # the slices as last listed or written, while in sync
        self._echo_writes: set[tuple[str, str]] = set()  # (name, resourceVersion) written here
        self._echo_deletes: set[str] = set()
        self._watcher: SliceWatcher | None = None
        self._failing = False  # the last publish failed: its Event was recorded, the next ones are not

    # -- the daemon's calls -------------------------------------------------------------------------
    def publish(self, devices: Sequence[DraDevice], unhealthy: frozenset[str],
                taints: Taints | None = None) -> int:
        """Make the slices hold `devices` less the unhealthy ones (by device or GPU UUID), or, with
        `taints` (by device name) and an API server that keeps them, every device with its taints; the
        number of API writes made (0 when they already do). Raises PublishError."""
        want = (tuple(devices), frozenset(unhealthy), None if taints is None else dict(taints))
        with self._lock:
            if want == self._want and self._in_sync and self._watching():
                return 0
            self._want = want
            # In sync and watched: the server holds what was last written (a stale guess is a 409,
            # retried from a fresh list), so a change costs its writes only.
            return self._sync(list(self._known) if self._in_sync and self._watching() else None)

    def start_watch(self, client: KubeClient | None = None) -> None:
        """Re-publish the last desired state whenever the slices change under us or the watch
        reconnects. `client`: one of the watch's own (closed when the watch ends); None shares the
        publisher's."""
        with self._lock:
            if self._watcher is not None:
                return
            self._watcher = SliceWatcher(client or self._client, node=self.node, driver=self.driver,
                                         on_change=self._on_event, owns_client=client is not None)
        self._watcher.start()

    def remove_all(self) -> int:
        """Delete every slice of this node's pool (the watch no longer re-creates them); how many."""
        with self._lock:
            self._want = None
            self._in_sync = False
            found = self._list()
            for obj in found:
                self._delete(_name(obj))
            return len(found)

    def requests(self) -> int:
        """API requests sent so far, the watch's lists and watch requests included."""
        watcher = self._watcher
        return self._requests + (watcher.requests if watcher is not None else 0)

    def stop(self) -> None:
        """Stop the watch (returns at once; see ListWatch.stop)."""
        with self._lock:
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()

    # -- comparing and writing ----------------------------------------------------------------------
    def _watching(self) -> bool:
        return self._watcher is not None and self._watcher.connected.is_set()

    def _sync(self, listed: list[dict[str, Any]] | None) -> int:
        """Bring the server to `_want`, from `listed` (None: list first); the writes made. A failure
        records a Warning Event, once until a publish succeeds again (the callers retry it)."""
        try:
            writes = self._sync_attempts(listed)
        except PublishError as err:
            if not self._failing and self._recorder is not None:
                self._recorder.event(PUBLISH_FAILED, f"this node's ResourceSlices of driver {self.driver} "
                                     f"are not published (tried again until they are): {err}")
            self._failing = True
            raise
        self._failing = False
        return writes

    def _sync_attempts(self, listed: list[dict[str, Any]] | None) -> int:
        for attempt in range(1, ATTEMPTS + 1):
            actual = listed if listed is not None else self._list()
            listed = None
            try:
                return self._apply(actual)
            except PublishError as err:
                if not isinstance(err.__cause__, Exception) or attempt == ATTEMPTS:
                    raise
                failure = classify(err.__cause__)
                if failure.kind != "status" or failure.code != 409:
                    raise
                self._log.info("ResourceSlices changed while being written (%s); reading them again",
                               failure.detail)
        raise AssertionError("unreachable")

    def _apply(self, actual: list[dict[str, Any]]) -> int:
        if self._want is None:
            return 0
        devices, unhealthy, wanted_taints = self._want
        taints = wanted_taints if self.taints_supported else None
        node_uid = self._node_uid_once()
        desired = desired_slices(node=self.node, node_uid=node_uid, driver=self.driver, devices=devices,
                                 unhealthy=unhealthy, generation=self._generation or 1, taints=taints)
        current = {_name(obj): obj for obj in actual}
        wanted = {_name(obj): obj for obj in desired}
        obsolete = sorted(set(current) - set(wanted))
        same = not obsolete and all(
            name in current and slice_content(current[name]) == slice_content(obj)
            for name, obj in wanted.items()
        ) and len({_generation(obj) for obj in current.values()}) <= 1
        if same:
            self._in_sync = True
            self._known = list(actual)
            return 0
        self._in_sync = False
        # Kept only once written: a write refused for any reason must not raise the next one's generation.
        generation = next_generation(self._generation, (_generation(obj) for obj in actual))
        desired = desired_slices(node=self.node, node_uid=node_uid, driver=self.driver, devices=devices,
                                 unhealthy=unhealthy, generation=generation, taints=taints)
        writes = 0
        dropped = False
        # Obsolete slices go first: a pool briefly short of devices is safe, one with a device twice is not.
        for name in obsolete:
            self._delete(name)
            current.pop(name)
            writes += 1
        for obj in desired:
            name = _name(obj)
            if name in current:
                body = {**obj, "metadata": {**obj["metadata"],
                                            "resourceVersion": _version(current[name])}}
                done = self._call(f"update ResourceSlice {name}", partial(replace_slice, self._client, body))
            else:
                done = self._call(f"create ResourceSlice {name}", partial(create_slice, self._client, obj))
            self._echo_writes.add((name, _version(done)))
            current[name] = done
            writes += 1
            dropped = dropped or (bool(slice_taints_of(obj)) and not slice_taints_of(done))
        self._generation = generation
        self._in_sync = True
        self._known = list(current.values())
        if dropped:
            # The devices written with taints are in the pool untainted: take them out at once.
            self._taints_dropped()
            return writes + self._apply(list(current.values()))
        return writes

    def _taints_dropped(self) -> None:
        self.taints_supported = False
        why = (f"the API server dropped the device taints written to this node's ResourceSlices (driver "
               f"{self.driver}): its DRADeviceTaints feature gate is off, so a GPU that goes down leaves "
               "the pool until it recovers instead of staying in it tainted; turn the gate on "
               "(--feature-gates=DRADeviceTaints=true on kube-apiserver, kube-scheduler and "
               "kube-controller-manager) and restart the DRA plugin to publish taints")
        self._log.warning("%s", why[0].upper() + why[1:])
        if self._recorder is not None:
            self._recorder.event(TAINTS_UNSUPPORTED, why)

    def _list(self) -> list[dict[str, Any]]:
        return self._call("list ResourceSlices",
                          partial(list_slices, self._client, node=self.node, driver=self.driver))

    def _delete(self, name: str) -> None:
        self._echo_deletes.add(name)
        self._call(f"delete ResourceSlice {name}", partial(delete_slice, self._client, name))

    def _node_uid_once(self) -> str:
        if self._node_uid is None:
            self._node_uid = self._call(f"get Node {self.node}",
                                        lambda: get_node_uid(self._client, self.node))
        return self._node_uid

    def _call(self, what: str, request: Callable[[], T]) -> T:
        self._requests += 1
        try:
            return request()
        except Exception as err:
            failure = classify(err)
            if failure.kind == "status" and failure.code == 403:
                fix = ("the service account needs the chart's DRA ClusterRole, and may only write slices "
                       f"whose spec.nodeName is its own node ({self.node})")
            elif failure.kind == "status" and failure.code == 404 and what.startswith("get Node"):
                fix = "NODE_NAME must name this node's Node object"
            elif failure.kind == "status":
                fix = "see the API server's message"
            else:
                fix = "the API server is unreachable; the watch publishes again once it answers"
            detail = f"{failure.code} {failure.detail}" if failure.kind == "status" else failure.detail
            raise PublishError(f"cannot {what}: {detail}; {fix}") from err

    # -- the watch ----------------------------------------------------------------------------------
    def _on_event(self, event: SliceEvent) -> None:
        with self._lock:
            if self._want is None:
                return
            if event.kind == "LISTED":
                # A fresh view: echoes the watch did not deliver before it broke will never come.
                self._echo_writes.clear()
                self._echo_deletes.clear()
                self._resync(list(event.slices), "the slice watch (re)started")
                return
            (obj,) = event.slices
            name = _name(obj)
            if event.kind == "DELETED":
                if name in self._echo_deletes:
                    self._echo_deletes.discard(name)
                    return
                why = f"ResourceSlice {name} was deleted by someone else"
            else:
                if (name, _version(obj)) in self._echo_writes:
                    self._echo_writes.discard((name, _version(obj)))
                    return
                done = "created" if event.kind == "ADDED" else "changed"
                why = f"ResourceSlice {name} was {done} by someone else"
            self._in_sync = False
            self._resync(None, why)

    def _resync(self, listed: list[dict[str, Any]] | None, why: str) -> None:
        try:
            writes = self._sync(listed)
        except PublishError as err:
            self._log.warning("%s; publishing again failed: %s", why, err)
            return
        if writes:
            self._log.info("%s; published this node's pool again (%d API write%s)", why, writes,
                           "" if writes == 1 else "s")
