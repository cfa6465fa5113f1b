"""Follow one Node's labels: GET it, then watch it by name, and start over after any failure.

The watch asks the API server for one object (field selector `metadata.name`), which it serves from
its watch cache: no list of all Nodes, no periodic re-list. A server-side timeout ends each watch
request; lightkube then re-opens it from the last resourceVersion seen. When anything fails (API
server restarted, 410 Gone, connection refused or dropped) the watcher waits with exponential back-off
and jitter, then GETs the Node again, so a change missed in between is still seen. The callback gets
every label state, including the first; while the API is unreachable it is simply not called.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import httpx2
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import GenericGlobalResource
from lightkube.resources.core_v1 import Node

from nvdp.kube.node import NodeLabels, get_node_labels, node_labels

log = logging.getLogger("nvdp.kube")

# Server-side timeout of one watch request: randomised between these (seconds) so that a fleet of
# watchers started together does not reconnect together (client-go's reflector uses 5-10 min).
WATCH_TIMEOUT_RANGE_S = (300, 600)


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


class NodeWatcher:
    """Calls `on_change(labels)` with the Node's current labels, then after every change.

    Owns `client`: `stop()` closes it to end a watch that is waiting for the next event.
    """

    def __init__(self, client: Client, node_name: str, on_change: Callable[[NodeLabels], None], *,
                 backoff: Backoff | None = None,
                 watch_timeout_range_s: tuple[int, int] = WATCH_TIMEOUT_RANGE_S) -> None:
        self.node_name = node_name
        self._client = client
        self._on_change = on_change
        self._backoff = backoff or Backoff()
        self._timeout_range = watch_timeout_range_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: NodeLabels | None = None
        self.connected = threading.Event()
        self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"node-watch-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._client.close()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self._deliver(get_node_labels(self._client, self.node_name))
                self.connected.set()
                self._backoff.reset()
                if self.failures:
                    log.info("node %s: watching again after %d failed attempt(s)",
                             self.node_name, self.failures)
                    self.failures = 0
                self._watch()
            except Exception as err:  # any failure: keep the last state, retry later
                if self._stop.is_set():
                    return
                self.connected.clear()
                self.failures += 1
                delay = self._backoff.next()
                level = logging.WARNING if self.failures == 1 or self.failures % 10 == 0 else logging.DEBUG
                log.log(level, "node %s: %s; keeping the current config, retrying in %.1f s (attempt %d)",
                        self.node_name, describe_error(err), delay, self.failures)
                self._stop.wait(delay)

    def _watch(self) -> None:
        assert self._last is not None
        timeout = random.randint(*self._timeout_range)
        events = self._client.watch(Node, fields={"metadata.name": self.node_name},
                                    resource_version=self._last.resource_version, server_timeout=timeout)
        for kind, obj in events:
            if self._stop.is_set():
                return
            if kind == "DELETED":
                log.warning("node %s was deleted; keeping the current config", self.node_name)
                continue
            if kind in ("ADDED", "MODIFIED") and not isinstance(obj, GenericGlobalResource):
                self._deliver(node_labels(obj))

    def _deliver(self, node: NodeLabels) -> None:
        changed = self._last is None or dict(node.labels) != dict(self._last.labels)
        self._last = node
        if changed:
            try:
                self._on_change(node)
            except Exception as err:  # the consumer's bug must not look like an API failure
                log.error("node %s: handling the label change failed: %s: %s", self.node_name,
                          type(err).__name__, err, exc_info=log.isEnabledFor(logging.DEBUG))
