"""The plugin's story as Kubernetes Events on its Node, so `kubectl describe node` shows it.

Recorded: devices turned Unhealthy by an XID (or a lost GPU), a config applied on reload and one
refused, an MPS resource waiting for its control daemon and the daemon answering again. The recorder
(nvdp.kube.EventRecorder) deduplicates and rate limits. Without API access (no NODE_NAME, no service
account token, no kubeconfig) nothing is recorded and the log, which has every line anyway, is all.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

NODE_NAME_ENV = "NODE_NAME"
# Where a pod's service account token is mounted (nvdp.kube.connect reads it there too).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_LIST_LIMIT = 4
_QUEUE_SIZE = 64  # beyond this, events are dropped (the recorder would rate limit them anyway)


class Recorder(Protocol):
    def record(self, event_type: str, reason: str, message: str) -> bool: ...


def _short(items: list[str]) -> str:
    shown = ", ".join(items[:_LIST_LIMIT])
    return shown if len(items) <= _LIST_LIMIT else f"{shown} and {len(items) - _LIST_LIMIT} more"


RecorderFactory = Callable[[], "Recorder | None"]


def api_configured(env: Mapping[str, str]) -> str | None:
    """Why there is no API access, judged without importing the client (None: there may be)."""
    if env.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
        return None
    config = env.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if Path(config).exists():
        return None
    return f"no service account token ({SERVICE_ACCOUNT_DIR}/token) and no kubeconfig at {config}"


class NodeEvents:
    """Sends on its own thread: an API server that is slow must not hold up health or reload work.

    The API client (about 200 ms and 11 MiB to import) is made on that thread when the first event
    is sent, so a node that has nothing to report never pays for it.
    """

    def __init__(self, make_recorder: RecorderFactory, log: logging.Logger) -> None:
        self._make_recorder = make_recorder
        self._log = log
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue(_QUEUE_SIZE)
        self._waiting: set[str] = set()
        self._thread = threading.Thread(target=self._send, name="node-events", daemon=True)
        self._thread.start()

    def _send(self) -> None:
        recorder: Recorder | None = None
        made = False
        while (item := self._queue.get()) is not None:
            if not made:
                made = True
                recorder = self._make_recorder()
            if recorder is None:
                continue  # no API access after all: said once, the log has the rest
            try:
                recorder.record(*item)
            except Exception as err:  # an Event is a courtesy: never a reason to stop
                self._log.warning("could not record event %s: %s", item[1], err)

    def _record(self, event_type: str, reason: str, message: str) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait((event_type, reason, message))

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to `timeout`), then stop."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    @classmethod
    def from_env(cls, env: Mapping[str, str], log: logging.Logger) -> NodeEvents | None:
        """Events on NODE_NAME through the pod's service account (or KUBECONFIG); None without access."""
        node = env.get(NODE_NAME_ENV, "")
        if not node:
            log.info("Node events off: NODE_NAME is not set (the log has every event)")
            return None
        missing = api_configured(env)
        if missing is not None:
            log.info("Node events off (no API access): %s", missing)
            return None

        def make() -> Recorder | None:
            try:
                from nvdp.kube import EventRecorder, KubeConnectError, connect
            except ImportError as err:  # the API client is an optional part of an install
                log.info("Node events off: %s", err)
                return None
            try:
                client = connect()
            except KubeConnectError as err:
                log.info("Node events off (no API access): %s", err)
                return None
            return EventRecorder(client, node, component="nvidia-device-plugin")

        log.info("Recording events on node %s", node)
        return cls(make, log)

    def devices_unhealthy(self, uuids: frozenset[str], reason: str) -> None:
        self._record(
            "Warning", "GPUUnhealthy",
            f"{reason}: {_short(sorted(uuids))} and the devices on them are Unhealthy; they stay so until "
            "the plugin reloads its config (SIGHUP) or restarts",
        )

    def config_applied(self, source: str, change: str) -> None:
        self._record("Normal", "ConfigApplied", f"configuration from {source} applied: {change}")

    def config_refused(self, error: str) -> None:
        first = error.strip().splitlines()
        detail = " ".join(line.strip() for line in first[:6])
        self._record(
            "Warning", "ConfigRefused", f"new configuration refused, the previous one keeps serving: {detail}"
        )

    def mps_waiting(self, resource: str, reason: str) -> None:
        self._waiting.add(resource)
        self._record("Warning", "MPSDaemonNotReady", reason)

    def mps_ready(self, resource: str) -> None:
        if resource in self._waiting:  # only the end of a wait is news
            self._waiting.discard(resource)
            self._record("Normal", "MPSDaemonReady", f"{resource}: the MPS control daemon answers; serving")
