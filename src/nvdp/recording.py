"""Recording points: one call per thing worth counting, a no-op until metrics are switched on.

The edges (gRPC server, health loop, signal handling, MPS gate and supervisor) call these; each is a
few dictionary lookups, so Allocate stays cheap. Until `enable_plugin()` or `enable_mps_daemon()` runs,
prometheus-client is not even imported: a plugin without `--metrics-address` pays nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

_series: ModuleType | None = None
# Where Node Events go (nvdp.plugin.node_events.NodeEvents); None: no API access, the log is all.
_events: Any = None


def enable() -> Any:
    """Import the series (nvdp.metrics) and start recording; returns the module."""
    global _series
    if _series is None:
        from nvdp import metrics

        _series = metrics
    return _series


def enabled() -> bool:
    return _series is not None


def set_events(events: Any) -> None:
    global _events
    _events = events


# --- plugin -----------------------------------------------------------------------------------------


def resource_state(devices: Iterable[tuple[str, int, int]], registered: Iterable[str]) -> None:
    """The advertised resources as (name, healthy, unhealthy), and which are registered; replaces all."""
    m = _series
    if m is None:
        return
    m.DEVICES.clear()
    m.RESOURCE_REGISTERED.clear()
    names = set(registered)
    for name, healthy, unhealthy in devices:
        m.DEVICES.labels(name, "healthy").set(healthy)
        m.DEVICES.labels(name, "unhealthy").set(unhealthy)
        m.RESOURCE_REGISTERED.labels(name).set(1 if name in names else 0)


def registration(resource: str, ok: bool) -> None:
    if _series is not None:
        _series.REGISTRATIONS.labels(resource, "success" if ok else "failure").inc()


def kubelet_restart() -> None:
    if _series is not None:
        _series.KUBELET_RESTARTS.inc()


# Allocate's labelled series per resource, looked up once: labels() takes a lock and builds a key.
_allocate_series: dict[str, tuple[Any, Any, Any]] = {}


def _allocate_children(resource: str) -> tuple[Any, Any, Any]:
    children = _allocate_series.get(resource)
    if children is None:
        m = _series
        assert m is not None
        children = (m.ALLOCATIONS.labels(resource), m.ALLOCATION_DEVICES.labels(resource),
                    m.ALLOCATE_DURATION.labels(resource))
        _allocate_series[resource] = children
    return children


def allocated(resource: str, devices: int) -> None:
    if _series is not None:
        count, sizes, _ = _allocate_children(resource)
        count.inc()
        sizes.observe(devices)


def allocation_refused(resource: str, reason: str) -> None:
    if _series is not None:
        _series.ALLOCATION_REFUSALS.labels(resource, reason).inc()


def allocate_duration(resource: str, seconds: float) -> None:
    if _series is not None:
        _allocate_children(resource)[2].observe(seconds)


def xid(gpu: str, code: int, action: str) -> None:
    """`action`: "ignored" (not critical under the health settings), or "critical" (devices Unhealthy)."""
    if _series is not None:
        _series.XID_EVENTS.labels(gpu, str(code), action).inc()


def _reload(result: str, at: float) -> None:
    if _series is not None:
        _series.CONFIG_RELOADS.labels(result).inc()
        _series.CONFIG_LAST_RELOAD.labels(result).set(at)


def config_applied(source: str, change: str, changed: bool, at: float, notify: bool = True) -> None:
    """A reload took effect; `changed`: some resource was added, removed or updated (an Event if `notify`)."""
    _reload("applied", at)
    if _events is not None and changed and notify:
        _events.config_applied(source, change)


def config_refused(error: str, at: float, notify: bool = True) -> None:
    _reload("refused", at)
    if _events is not None and notify:
        _events.config_refused(error)


def devices_unhealthy(uuids: frozenset[str], reason: str) -> None:
    """Health turned devices Unhealthy (the nvdp_devices gauge shows it at the next scrape)."""
    if _events is not None:
        _events.devices_unhealthy(uuids, reason)


def config_active(source: str, entry: str) -> None:
    if _series is not None:
        _series.CONFIG_ACTIVE.clear()
        _series.CONFIG_ACTIVE.labels(source, entry).set(1)


def mps_ready(resource: str, ready: bool, reason: str = "") -> None:
    """`reason`: what is missing and the fix, when not ready."""
    if _series is not None:
        _series.MPS_READY.labels(resource).set(1 if ready else 0)
    if _events is not None:
        if ready:
            _events.mps_ready(resource)
        else:
            _events.mps_waiting(resource, reason)


def mps_gone(resource: str) -> None:
    if _series is not None:
        with contextlib.suppress(KeyError):
            _series.MPS_READY.remove(resource)


# --- MPS control daemon -----------------------------------------------------------------------------


def mps_daemon_ready(resource: str, ready: bool) -> None:
    if _series is not None:
        _series.MPS_DAEMON_READY.labels(resource).set(1 if ready else 0)


def mps_daemon_start(resource: str, ok: bool) -> None:
    if _series is not None:
        _series.MPS_DAEMON_STARTS.labels(resource, "started" if ok else "failed").inc()


def mps_daemon_restart(resource: str) -> None:
    if _series is not None:
        _series.MPS_DAEMON_RESTARTS.labels(resource).inc()


def mps_command(resource: str, command: str, ok: bool) -> None:
    if _series is not None:
        _series.MPS_COMMANDS.labels(resource, command, "ok" if ok else "error").inc()
