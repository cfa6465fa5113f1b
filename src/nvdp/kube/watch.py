"""Follow one Node's labels (and, through `ListWatch`, other objects): list, watch from there, and start
over after any failure.

Both requests select the one Node by name (field selector `metadata.name`), so the API server
answers from its watch cache: no list of all Nodes. The watch starts at the list's resourceVersion
(the collection's, which is current, not the Node's own, which can be hours old on a quiet node).

A server-side timeout (randomised, 15-30 min) ends each watch request; lightkube re-opens it from
the last resourceVersion it saw. On a quiet Node that version has usually left the watch cache, so
the server answers 410 Gone: the expected end of a watch cycle, answered at once with a new list.
Any other failure (API server restarted, connection refused or dropped) waits with exponential
back-off and jitter first, and so does a 410 that follows a fresh list (no busy loop). The callback
gets every label state, including the first; while the API is unreachable it is simply not called.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import httpx2
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import GenericGlobalResource
from lightkube.resources.core_v1 import Node

from nvdp.kube.node import NodeLabels, list_node, node_labels

log = logging.getLogger("nvdp.kube")

# Server-side timeout of one watch request: randomised between these (seconds) so that a fleet of
# watchers started together does not reconnect together. Longer than client-go's 5-10 min: each
# cycle costs a re-list here (lightkube does not ask for bookmarks), and keepalive, not the timeout,
# finds dead connections.
WATCH_TIMEOUT_RANGE_S = (900, 1800)
# A watch that lasted this long was healthy: its end is not a failure to back off from.
HEALTHY_WATCH_S = 30.0


class Backoff:
    """Exponential back-off with full jitter in [delay/2, delay]; reset after a success."""

    def __init__(self, initial_s: float = 1.0, maximum_s: float = 30.0,
                 rand: Callable[[], float] = random.random) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self._rand = rand
        self._delay = initial_s

    def next(self) -> float:
        delay = self._delay
        self._delay = min(self._delay * 2, self.maximum_s)
        return delay / 2 + self._rand() * delay / 2

    def reset(self) -> None:
        self._delay = self.initial_s


def describe_error(err: BaseException) -> str:
    if isinstance(err, ApiError):
        status = err.status
        return f"API server answered {status.code} {status.reason or ''}: {status.message or ''}".strip()
    if isinstance(err, httpx2.HTTPError):
        return f"API server unreachable: {type(err).__name__}: {err}"
    return f"{type(err).__name__}: {err}"


class ListWatch:
    """The list-then-watch loop shared by the watchers: `_list()` delivers the current state and returns
    the list's resourceVersion, `_watch()` follows the changes from there; any failure starts over.

    Owns `client` when `owns_client` (the default), and closes it from its own thread when it ends:
    closed from another thread while a watch read is blocked, the read's connection stays open in the
    kernel, and when the next event wakes it the TLS close goes out on the file descriptor number, by
    then another connection's (seen as "wrong version number" on that one). So `stop()` returns at
    once and the thread ends at the next event or server-side timeout; it is a daemon thread and never
    delivers again.
    """

    def __init__(self, client: Client, what: str, *, backoff: Backoff | None = None,
                 watch_timeout_range_s: tuple[int, int] = WATCH_TIMEOUT_RANGE_S, owns_client: bool = True,
                 keeping: str = "keeping the current state") -> None:
        self._client = client
        self._what = what  # "node gpu-1": how log lines name what is watched
        self._keeping = keeping  # what the daemon does meanwhile, for the failure log line
        self._owns_client = owns_client
        self._backoff = backoff or Backoff()
        self._timeout_range = watch_timeout_range_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.connected = threading.Event()
        self.failures = 0

    def start(self) -> None:
        name = "watch-" + self._what.replace(" ", "-")
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 0.5) -> None:
        """Stop delivering; wait up to `timeout_s` for the thread (it is not between reads)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        elif not self._stopped and self._owns_client:
            self._client.close()  # never started: nothing reads from it

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        try:
            self._run()
        finally:
            self._stopped = True
            if self._owns_client:
                self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                list_version = self._list()
                self.connected.set()
                if self.failures:
                    log.info("%s: watching again after %d failed attempt(s)", self._what, self.failures)
                    self.failures = 0
                self._watch(list_version, random.randint(*self._timeout_range))
            except Exception as err:  # any failure: keep the last state, retry later
                if self._stop.is_set():
                    return
                healthy = time.monotonic() - started >= HEALTHY_WATCH_S
                if healthy:
                    self._backoff.reset()
                if healthy and isinstance(err, ApiError) and err.status.code == 410:
                    log.debug("%s: watch cycle ended (%s); listing again", self._what, describe_error(err))
                    continue
                self.connected.clear()
                self.failures += 1
                delay = self._backoff.next()
                level = logging.WARNING if self.failures == 1 or self.failures % 10 == 0 else logging.DEBUG
                log.log(level, "%s: %s; %s, retrying in %.1f s (attempt %d)", self._what,
                        describe_error(err), self._keeping, delay, self.failures)
                self._stop.wait(delay)

    def _list(self) -> str:
        """List, deliver what was found, and return the list's resourceVersion."""
        raise NotImplementedError

    def _watch(self, resource_version: str, server_timeout_s: int) -> None:
        """Watch from `resource_version` and deliver each event until the watch ends or `stop()`."""
        raise NotImplementedError


class NodeWatcher(ListWatch):
    """Calls `on_change(labels)` with the Node's current labels, then after every change.

    Owns `client` (see `ListWatch`).
    """

    def __init__(self, client: Client, node_name: str, on_change: Callable[[NodeLabels], None], *,
                 backoff: Backoff | None = None,
                 watch_timeout_range_s: tuple[int, int] = WATCH_TIMEOUT_RANGE_S) -> None:
        super().__init__(client, f"node {node_name}", backoff=backoff,
                         watch_timeout_range_s=watch_timeout_range_s, keeping="keeping the current config")
        self.node_name = node_name
        self._on_change = on_change
        self._last: NodeLabels | None = None

    def _list(self) -> str:
        node, list_version = list_node(self._client, self.node_name)
        self._deliver(node)
        return list_version

    def _watch(self, resource_version: str, server_timeout_s: int) -> None:
        events = self._client.watch(Node, fields={"metadata.name": self.node_name},
                                    resource_version=resource_version, server_timeout=server_timeout_s)
        for kind, obj in events:
            if self._stop.is_set():
                return
            if kind == "DELETED":
                log.warning("node %s was deleted; keeping the current config", self.node_name)
                continue
            if kind in ("ADDED", "MODIFIED") and not isinstance(obj, GenericGlobalResource):
                self._deliver(node_labels(obj))

    def _deliver(self, node: NodeLabels) -> None:
        if self._stop.is_set():
            return
        changed = self._last is None or dict(node.labels) != dict(self._last.labels)
        self._last = node
        if changed:
            try:
                self._on_change(node)
            except Exception as err:  # the consumer's bug must not look like an API failure
                log.error("node %s: handling the label change failed: %s: %s", self.node_name,
                          type(err).__name__, err, exc_info=log.isEnabledFor(logging.DEBUG))
