"""What the plugin's HTTP endpoints read from the running plugin: a read-only view, never the process.

`PluginState` is all that /readyz, /healthz and /metrics need; nvdp.plugin.observe depends on it
alone, so the endpoints neither reach into the process object nor import it. `ServingView` is the
view over what a plugin process holds: its manager and health monitor, which a reload replaces, so
the view reads them at each request. Every member answers quickly (a lock taken, a few fields read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from msgspec.structs import replace

from nvdp.daemon.report.probes import ResourceStatus

if TYPE_CHECKING:
    from nvdp.plugin.manager import PluginManager


class PluginState(Protocol):
    def not_serving(self) -> str | None:
        """Why the plugin does not serve yet ("starting"); None once it serves, or knowingly serves
        nothing (no NVML with failOnInitError false)."""
        ...

    def resources(self) -> Sequence[ResourceStatus]:
        """Each planned resource: registered or not, why an MPS gate holds it back, its healthy and
        unhealthy device counts; empty when nothing is planned or served."""
        ...

    def kubelet_socket(self) -> str | None:
        """The path of the kubelet's registration socket in force; None when nothing is served."""
        ...

    def responsive(self, timeout: float) -> bool | None:
        """Whether the plugin's state can be locked within `timeout` seconds (False: something is
        stuck); None when there is nothing to lock yet."""
        ...

    def server_sockets(self) -> Sequence[tuple[str, str]]:
        """(resource, socket path) of every resource's gRPC server, started or not."""
        ...

    def health_stalled(self, now: float) -> str | None:
        """Why the health loop looks stuck at `now` (time.monotonic()); None when fine or not running."""
        ...


class _Stalls(Protocol):
    """The health monitor, or what holds it (nvdp.daemon.healthwatch.HealthWatch)."""

    def stalled(self, now: float) -> str | None: ...


class _Holds(Protocol):
    """What a plugin process holds, as ServingView reads it."""

    @property
    def not_serving_reason(self) -> str | None: ...

    @property
    def manager(self) -> PluginManager | None: ...

    @property
    def health(self) -> _Stalls | None: ...


class ServingView:
    """PluginState over a plugin process's manager and health monitor, read at each call."""

    def __init__(self, process: _Holds) -> None:
        self._process = process

    def not_serving(self) -> str | None:
        return self._process.not_serving_reason

    def resources(self) -> Sequence[ResourceStatus]:
        manager = self._process.manager
        if manager is None:
            return []
        counts = {r.name: (sum(d.healthy for d in r.devices), sum(not d.healthy for d in r.devices))
                  for r in manager.plan.resources}
        return [replace(s, healthy=counts.get(s.name, (0, 0))[0], unhealthy=counts.get(s.name, (0, 0))[1])
                for s in manager.resource_status()]

    def kubelet_socket(self) -> str | None:
        manager = self._process.manager
        return manager.kubelet_socket if manager is not None else None

    def responsive(self, timeout: float) -> bool | None:
        manager = self._process.manager
        return manager.responsive(timeout) if manager is not None else None

    def server_sockets(self) -> Sequence[tuple[str, str]]:
        manager = self._process.manager
        return manager.sockets() if manager is not None else []

    def health_stalled(self, now: float) -> str | None:
        health = self._process.health
        return health.stalled(now) if health is not None else None
