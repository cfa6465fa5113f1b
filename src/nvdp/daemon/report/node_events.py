"""The process's one writer of Kubernetes Events on its Node, so `kubectl describe node` shows them.

nvdp.daemon.report.recording.Recorder words the Events (devices turned Unhealthy, a config applied or
refused, an
MPS resource waiting for its control daemon, a per-node config problem); this module only sends
them. The API-side recorder (nvdp.kube.EventRecorder) deduplicates and rate limits per reason.
Without API access (no NODE_NAME, no service account token, no kubeconfig) nothing is sent and the
log, which has every line anyway, is all.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from nvdp.config import names

# Where a pod's service account token is mounted (nvdp.kube.connect reads it there too).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
COMPONENT = "nvidia-device-plugin"
# Beyond this many unsent events, new ones are dropped (logged): the API server is not keeping up.
_QUEUE_SIZE = 64


class KubeEvents(Protocol):
    """nvdp.kube.EventRecorder, as this module uses it."""

    node_uid: str

    def record(self, event_type: str, reason: str, message: str) -> bool: ...


KubeEventsFactory = Callable[[], "KubeEvents | None"]
# An item of the queue: an Event (type, reason, message), or the Node's UID to refer to from now on.
_Item = tuple[str, str, str] | str | None


def api_configured(env: Mapping[str, str], kubeconfig: str | None = None) -> str | None:
    """Why there is no API access, judged without importing the client (None: there may be)."""
    if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
        return None
    config = kubeconfig or env.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if Path(config).exists():
        return None
    return f"no service account token ({SERVICE_ACCOUNT_DIR}/token) and no kubeconfig at {config}"


class NodeEvents:
    """Sends on its own thread: an API server that is slow must not hold up health or reload work.

    The API client (about 200 ms and 11 MiB to import) is made on that thread when the first event
    is sent, so a node that has nothing to report never pays for it.
    """

    def __init__(self, make_kube_events: KubeEventsFactory, log: logging.Logger) -> None:
        self._make_kube_events = make_kube_events
        self._log = log
        self._queue: queue.Queue[_Item] = queue.Queue(_QUEUE_SIZE)
        self._thread = threading.Thread(target=self._send, name="node-events", daemon=True)
        self._thread.start()

    def _send(self) -> None:
        kube_events: KubeEvents | None = None
        made = False
        node_uid = ""
        while (item := self._queue.get()) is not None:
            if isinstance(item, str):
                node_uid = item
                if kube_events is not None:
                    kube_events.node_uid = item
                continue
            if not made:
                made = True
                kube_events = self._make_kube_events()
                if kube_events is not None and node_uid:
                    kube_events.node_uid = node_uid
            if kube_events is None:
                continue  # no API access after all: said once, the log has the rest
            try:
                kube_events.record(*item)
            except Exception as err:  # an Event is a courtesy: never a reason to stop
                self._log.warning("could not record event %s: %s", item[1], err)

    def record(self, event_type: str, reason: str, message: str) -> None:
        """Queue an Event; never blocks (a full queue drops it, with a WARNING naming it)."""
        try:
            self._queue.put_nowait((event_type, reason, message))
        except queue.Full:
            self._log.warning("%d events wait for the API server; not recorded: %s %s: %s", _QUEUE_SIZE,
                              event_type, reason, message)

    def node_seen(self, uid: str) -> None:
        """The Node's UID, for the Events' involvedObject (read from the Node by its watcher)."""
        # Full: the name alone still finds the Node, and the next label change brings the UID again.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(uid)

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to `timeout`), then stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            self._log.warning("events still unsent after %gs; stopping without them", timeout)
        self._thread.join(timeout)

    @classmethod
    def from_env(cls, env: Mapping[str, str], log: logging.Logger, *, component: str = COMPONENT,
                 node_name: str | None = None, kubeconfig: str | None = None) -> NodeEvents | None:
        """Events on the Node (`node_name`, else NODE_NAME) through the pod's service account, or
        `kubeconfig` (else KUBECONFIG); None without access."""
        node = names.node_name(env, node_name)
        if not node:
            log.info("Node events off: NODE_NAME is not set (the log has every event)")
            return None
        missing = api_configured(env, kubeconfig)
        if missing is not None:
            log.info("Node events off (no API access): %s", missing)
            return None

        def make() -> KubeEvents | None:
            try:
                from nvdp.kube import EventRecorder, KubeConnectError, connect
            except ImportError as err:  # the API client is an optional part of an install
                log.info("Node events off: %s", err)
                return None
            try:
                client = connect(kubeconfig)
            except KubeConnectError as err:
                log.info("Node events off (no API access): %s", err)
                return None
            return EventRecorder(client, node, component=component)

        log.info("Recording events on node %s", node)
        return cls(make, log)
