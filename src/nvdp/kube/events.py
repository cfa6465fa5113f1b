"""Record Kubernetes Events on the Node (`kubectl describe node` lists them), and on a ResourceClaim
(`record_claim_event`, for what the claim's author must fix).

Writes are the fleet's cost, so the recorder drops an event equal (type, reason, message) to one it
recorded within `dedupe_window_s`, and allows at most `burst` events of each reason, refilled one per
`refill_s`. The limit is per reason so that routine Normal events (a config applied on every label
switch) never use up what a problem needs: an invalid config or a mistyped label always reaches the
Node unless the same problem was just recorded. An event dropped by the limit is logged at WARNING
with its message, so it is never lost without a trace. Failures to write are logged and forgotten:
an Event is a courtesy, never a reason to stop serving.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable

import httpx2
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

log = logging.getLogger("nvdp.kube")

# Node events live in the default namespace (as the kubelet's do); kubectl describe node finds them there.
EVENT_NAMESPACE = "default"
MAX_MESSAGE = 1024


class EventRecorder:
    def __init__(self, client: Client, node_name: str, *, component: str = "nvidia-device-plugin",
                 node_uid: str = "", dedupe_window_s: float = 600.0, burst: int = 5,
                 refill_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.node_name = node_name
        self.node_uid = node_uid
        self.component = component
        self._client = client
        self._dedupe_window_s = dedupe_window_s
        self._burst = burst
        self._refill_s = refill_s
        self._clock = clock
        # reason -> (tokens left, when last refilled); reasons are a fixed set of words, so it stays small
        self._buckets: dict[str, tuple[float, float]] = {}
        self._recent: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self.suppressed = 0

    def warning(self, reason: str, message: str) -> bool:
        return self.record("Warning", reason, message)

    def normal(self, reason: str, message: str) -> bool:
        return self.record("Normal", reason, message)

    def record(self, event_type: str, reason: str, message: str) -> bool:
        """True when the Event was written; False when deduplicated, rate limited or refused."""
        message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
        key = (event_type, reason, message)
        with self._lock:
            now = self._clock()
            self._recent = {k: t for k, t in self._recent.items() if now - t < self._dedupe_window_s}
            if key in self._recent:
                self.suppressed += 1
                return False
            tokens, filled_at = self._buckets.get(reason, (float(self._burst), now))
            tokens = min(self._burst, tokens + (now - filled_at) / self._refill_s)
            if tokens < 1:
                self._buckets[reason] = (tokens, now)
                self.suppressed += 1
                log.warning("%s events on node %s reached their limit (%d, then one every %gs); "
                            "not recorded: %s: %s", reason, self.node_name, self._burst, self._refill_s,
                            event_type, message)
                return False
            self._buckets[reason] = (tokens - 1, now)
            self._recent[key] = now
        return self._create(event_type, reason, message)

    def _create(self, event_type: str, reason: str, message: str) -> bool:
        stamp = datetime.datetime.now(datetime.timezone.utc)
        event = Event(
            metadata=ObjectMeta(name=f"{self.node_name}.{time.time_ns():x}", namespace=EVENT_NAMESPACE),
            involvedObject=ObjectReference(kind="Node", apiVersion="v1", name=self.node_name,
                                           uid=self.node_uid or self.node_name),
            type=event_type, reason=reason, message=message, count=1,
            firstTimestamp=stamp, lastTimestamp=stamp,
            source=EventSource(component=self.component, host=self.node_name),
        )
        try:
            self._client.create(event, namespace=EVENT_NAMESPACE)
        except (ApiError, httpx2.HTTPError) as err:
            log.warning("could not record event %s on node %s: %s", reason, self.node_name, err)
            return False
        return True


def record_claim_event(client: Client, *, namespace: str, name: str, uid: str, event_type: str,
                       reason: str, message: str, component: str, host: str) -> bool:
    """Record an Event on a ResourceClaim, in its namespace (`kubectl describe resourceclaim` lists it);
    True when written. A failure is logged and forgotten, as for Node Events."""
    message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
    stamp = datetime.datetime.now(datetime.timezone.utc)
    event = Event(
        metadata=ObjectMeta(name=f"{name}.{time.time_ns():x}", namespace=namespace),
        involvedObject=ObjectReference(kind="ResourceClaim", apiVersion="resource.k8s.io/v1",
                                       namespace=namespace, name=name, uid=uid),
        type=event_type, reason=reason, message=message, count=1, firstTimestamp=stamp, lastTimestamp=stamp,
        source=EventSource(component=component, host=host),
    )
    try:
        client.create(event, namespace=namespace)
    except (ApiError, httpx2.HTTPError) as err:
        log.warning("could not record event %s on claim %s/%s: %s", reason, namespace, name, err)
        return False
    return True
