"""The kubelet's DRAResourceHealth service (KEP-4680): each published device's health, streamed.

The kubelet (ResourceHealthStatus, beta and on in 1.36) calls `NodeWatchResources` on the DRA socket
and shows each allocated device's health and message in the pod's
`status.containerStatuses[].allocatedResourcesStatus`. Kubelet 1.36 calls the `v1alpha1` service;
later kubelets call `v1beta1` and `v1`, the same messages under other packages: all three are served.

`HealthFeed` holds the devices' health as last set (`update`, with `nvdp.dra.pool.taints.device_health`'s
answer, on every change of the health record); each open stream sends the whole list at once, again
within a second of every update, and again every `RESEND_S` seconds: the kubelet counts a device it
has heard nothing of for `health_check_timeout_seconds` as Unknown. A stream ends when the kubelet
goes (it opens a new one when it comes back) or when the feed is closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from nvdp.dra.kubelet.api import dra_health_v1_pb2, dra_health_v1alpha1_pb2, dra_health_v1beta1_pb2
from nvdp.dra.kubelet.api import dra_health_v1_pb2_grpc as _v1_grpc
from nvdp.dra.kubelet.api import dra_health_v1alpha1_pb2_grpc as _v1alpha1_grpc
from nvdp.dra.kubelet.api import dra_health_v1beta1_pb2_grpc as _v1beta1_grpc
from nvdp.dra.pool.taints import DeviceHealth

# The kubelet's verdict expires this long after the last list it got (it counts the time itself).
TIMEOUT_S = 60
# Every stream re-sends the whole list this often, well within TIMEOUT_S.
RESEND_S = 20.0
# How often a waiting stream looks whether its kubelet is still there.
_POLL_S = 1.0

# (messages, service module) per version, the kubelet's first.
VERSIONS: tuple[tuple[ModuleType, Any], ...] = (
    (dra_health_v1alpha1_pb2, _v1alpha1_grpc),
    (dra_health_v1beta1_pb2, _v1beta1_grpc),
    (dra_health_v1_pb2, _v1_grpc),
)


class HealthFeed:
    """The pool's device health as last set, for the streams; thread-safe."""

    def __init__(self, pool: str, *, timeout_s: int = TIMEOUT_S, resend_s: float = RESEND_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self.resend_s = resend_s
        self._clock = clock
        self._changed = threading.Condition()
        self._health: tuple[DeviceHealth, ...] = ()
        self._version = 0
        self._closed = False
        self._streams = 0

    def update(self, health: Mapping[str, DeviceHealth]) -> None:
        """Set every published device's health (all of them: a device left out turns Unknown)."""
        current = tuple(health.values())
        with self._changed:
            if current == self._health:
                return
            self._health = current
            self._version += 1
            self._changed.notify_all()

    def close(self) -> None:
        """End every stream (the plugin stops)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def streams(self) -> int:
        """The streams open now."""
        with self._changed:
            return self._streams

    def watch(self, active: Callable[[], bool]) -> Iterator[tuple[DeviceHealth, ...]]:
        """The whole list now, after every update, and every `resend_s`, while `active()` holds."""
        with self._changed:
            self._streams += 1
            seen = -1
        try:
            while True:
                with self._changed:
                    deadline = self._clock() + self.resend_s
                    while (not self._closed and self._version == seen and active()
                           and self._clock() < deadline):
                        self._changed.wait(min(_POLL_S, max(0.0, deadline - self._clock())))
                    if self._closed or not active():
                        return
                    seen, health = self._version, self._health
                yield health
        finally:
            with self._changed:
                self._streams -= 1

    def response(self, api: ModuleType, health: tuple[DeviceHealth, ...]) -> Any:
        """One NodeWatchResourcesResponse of `api`'s version."""
        now = int(self._clock())
        return api.NodeWatchResourcesResponse(devices=[
            api.DeviceHealth(
                device=api.DeviceIdentifier(pool_name=self.pool, device_name=h.device),
                health=api.HEALTHY if h.healthy else api.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=self.timeout_s,
                message=h.message,
            )
            for h in health
        ])


class _HealthServicer:
    def __init__(self, api: ModuleType, feed: HealthFeed) -> None:
        self._api = api
        self._feed = feed

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        for health in self._feed.watch(context.is_active):
            yield self._feed.response(self._api, health)


def add_health_services(server: Any, feed: HealthFeed) -> None:
    """Register DRAResourceHealth in every version on `server` (the DRA socket's gRPC server)."""
    for api, services in VERSIONS:
        services.add_DRAResourceHealthServicer_to_server(_HealthServicer(api, feed), server)
