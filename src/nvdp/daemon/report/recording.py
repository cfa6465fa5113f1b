"""What a process records: metrics and Node Events, through one `Recorder` built at start and passed in.

There is no process-wide Recorder to reach for: each daemon's skeleton (nvdp.daemon.skeleton) builds
its own and hands it down (the plugin: its work -> PluginManager -> each resource's server and MPS
gate, and the health monitor; the MPS daemon: Daemons -> each supervisor). A part built without one
(tests, the doctor's MPS check) makes a Recorder of its own, which records nowhere but its metrics.

The edges (gRPC server, health loop, signal handling, per-node config, MPS gate and supervisor) call
its methods, one per thing worth counting or telling; each is a few dictionary lookups, so Allocate
stays cheap. Metrics are off until `enable_metrics()` (`--metrics-address`): until then
prometheus-client is not even imported, and a process without the flag pays nothing for them.
Node Events go to the process's one writer (`attach_events`, nvdp.daemon.report.node_events.NodeEvents,
which sends them on its own thread); without API access there is none and the log is all. The
Recorder words the Events (what a kubectl user reads); the writer only sends them. Every reason is
declared in nvdp.daemon.report.event_reasons, with the daemons that own it; an undeclared one is refused with
an
ERROR in the log, and a daemon's Recorder (`owner`) records only the reasons it owns.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any, Protocol

from nvdp.daemon.report.event_reasons import owns, undeclared

log = logging.getLogger("nvdp.daemon.report.recording")


class EventWriter(Protocol):
    """Sends Events on the Node (nvdp.daemon.report.node_events.NodeEvents); must not block the caller."""

    def record(self, event_type: str, reason: str, message: str) -> None: ...

    def node_seen(self, uid: str) -> None: ...

    def close(self, timeout: float = 2.0) -> None: ...


class Recorder:
    """Metrics and Node Events of one process; every method is safe from any thread."""

    def __init__(self, events: EventWriter | None = None, *, owner: str | None = None) -> None:
        self._series: ModuleType | None = None
        self._events = events
        # The daemon recording (NodeEvents' component): it records only the reasons it owns in
        # nvdp.daemon.report.event_reasons; None (tests, the doctor) records every declared reason.
        self._owner = owner
        # Allocate's labelled series per resource, looked up once: labels() takes a lock and builds a key.
        self._allocate_series: dict[str, tuple[Any, Any, Any]] = {}
        self._mps_waiting: set[str] = set()

    # --- switches ----------------------------------------------------------------------------

    def enable_metrics(self) -> ModuleType:
        """Import the series (nvdp.daemon.report.metrics) and start recording them; returns the module."""
        if self._series is None:
            from nvdp.daemon.report import metrics

            self._series = metrics
        return self._series

    @property
    def metrics_enabled(self) -> bool:
        return self._series is not None

    def attach_events(self, events: EventWriter | None) -> None:
        """Where Node Events go from now on; None: nowhere (the callers' log lines are all)."""
        self._events = events

    # --- Node Events -------------------------------------------------------------------------

    def event(self, reason: str, message: str, *, warning: bool = True) -> None:
        """An Event on the Node (Warning, or Normal with `warning=False`); the caller logs it too.
        A reason not declared for the Node in nvdp.daemon.report.event_reasons is not recorded (logged as an
        ERROR)."""
        problem = undeclared(reason, "Node")
        if problem is not None:
            log.error("%s; not recorded: %s", problem, message)
            return
        if self._events is None or not owns(self._owner, reason):
            return  # another daemon of the node records it; the caller's log line is all here
        self._events.record("Warning" if warning else "Normal", reason, message)

    def node_seen(self, uid: str) -> None:
        """The Node's UID as its watcher read it, for the Events' involvedObject."""
        if self._events is not None:
            self._events.node_seen(uid)

    def close(self) -> None:
        """Send the Events still queued (a few seconds at most) and stop the writer; the process ends."""
        events, self._events = self._events, None
        if events is not None:
            events.close()

    # --- plugin ------------------------------------------------------------------------------

    def resource_state(self, devices: Iterable[tuple[str, int, int]], registered: Iterable[str]) -> None:
        """The advertised resources as (name, healthy, unhealthy), and which are registered; replaces all."""
        m = self._series
        if m is None:
            return
        m.DEVICES.clear()
        m.RESOURCE_REGISTERED.clear()
        names = set(registered)
        for name, healthy, unhealthy in devices:
            m.DEVICES.labels(name, "healthy").set(healthy)
            m.DEVICES.labels(name, "unhealthy").set(unhealthy)
            m.RESOURCE_REGISTERED.labels(name).set(1 if name in names else 0)

    def registration(self, resource: str, ok: bool) -> None:
        if self._series is not None:
            self._series.REGISTRATIONS.labels(resource, "success" if ok else "failure").inc()

    def kubelet_restart(self) -> None:
        if self._series is not None:
            self._series.KUBELET_RESTARTS.inc()

    def _allocate_children(self, resource: str) -> tuple[Any, Any, Any]:
        children = self._allocate_series.get(resource)
        if children is None:
            m = self._series
            assert m is not None
            children = (m.ALLOCATIONS.labels(resource), m.ALLOCATION_DEVICES.labels(resource),
                        m.ALLOCATE_DURATION.labels(resource))
            self._allocate_series[resource] = children
        return children

    def allocated(self, resource: str, devices: int) -> None:
        if self._series is not None:
            count, sizes, _ = self._allocate_children(resource)
            count.inc()
            sizes.observe(devices)

    def allocation_refused(self, resource: str, reason: str) -> None:
        if self._series is not None:
            self._series.ALLOCATION_REFUSALS.labels(resource, reason).inc()

    def allocate_duration(self, resource: str, seconds: float) -> None:
        if self._series is not None:
            self._allocate_children(resource)[2].observe(seconds)

    def xid(self, gpu: str, code: int, action: str) -> None:
        """`action`: "ignored" (not critical under the health settings), or "critical" (devices Unhealthy)."""
        if self._series is not None:
            self._series.XID_EVENTS.labels(gpu, str(code), action).inc()

    def _reload(self, result: str, at: float) -> None:
        if self._series is not None:
            self._series.CONFIG_RELOADS.labels(result).inc()
            self._series.CONFIG_LAST_RELOAD.labels(result).set(at)

    def config_applied(self, source: str, change: str, changed: bool, at: float, notify: bool = True) -> None:
        """A reload took effect; `changed`: a resource was added, removed or updated (Event if `notify`)."""
        self._reload("applied", at)
        if changed and notify:
            self.event("ConfigApplied", f"configuration from {source} applied: {change}", warning=False)

    def config_refused(self, error: str, at: float, notify: bool = True) -> None:
        self._reload("refused", at)
        if notify:
            detail = " ".join(line.strip() for line in error.strip().splitlines()[:6])
            self.event("ConfigRefused",
                       f"new configuration refused, the previous one keeps serving: {detail}")

    # Health changes: reason of the Node Event, and whether it is a Warning.
    _HEALTH_EVENTS = {"down": ("GPUUnhealthy", True), "held": ("GPUFlapping", True),
                      "blocked": ("GPURecoveryBlocked", True), "recovered": ("GPUHealthy", False),
                      "cleared": ("GPUCleared", False)}

    def health_changed(self, kind: str, gpu: str, message: str) -> None:
        """A GPU went down, was held down, was kept down by a re-check, came back or was cleared."""
        reason, warning = self._HEALTH_EVENTS[kind]
        self.event(reason, message, warning=warning)
        if self._series is not None and kind in ("recovered", "cleared"):
            self._series.HEALTH_RECOVERIES.labels(gpu, "cleared" if kind == "cleared" else "recovered").inc()

    def health_states(self, states: dict[str, str]) -> None:
        """GPUs that are down, by state (recovering, needs-reset, flapping, recovery-off); replaces all."""
        if self._series is None:
            return
        self._series.GPU_HEALTH.clear()
        for gpu, state in states.items():
            self._series.GPU_HEALTH.labels(gpu, state).set(1)

    def config_active(self, source: str, entry: str) -> None:
        if self._series is not None:
            self._series.CONFIG_ACTIVE.clear()
            self._series.CONFIG_ACTIVE.labels(source, entry).set(1)

    def mps_ready(self, resource: str, ready: bool, reason: str = "") -> None:
        """`reason`: what is missing and the fix, when not ready."""
        if self._series is not None:
            self._series.MPS_READY.labels(resource).set(1 if ready else 0)
        if not ready:
            self._mps_waiting.add(resource)
            self.event("MPSDaemonNotReady", reason)
        elif resource in self._mps_waiting:  # only the end of a wait is news
            self._mps_waiting.discard(resource)
            self.event("MPSDaemonReady", f"{resource}: the MPS control daemon answers; serving",
                       warning=False)

    def mps_gone(self, resource: str) -> None:
        if self._series is not None:
            with contextlib.suppress(KeyError):
                self._series.MPS_READY.remove(resource)

    # --- DRA kubelet plugin (NVIDIA's nvidia_dra_* series) ------------------------------------

    def dra_serving(self, driver: str, operations: Iterable[str]) -> None:
        """The driver serves the kubelet: its request series exist from the start, at 0."""
        m = self._series
        if m is None:
            return
        for operation in operations:
            m.DRA_REQUESTS.labels(driver, operation)
            m.DRA_REQUEST_DURATION.labels(driver, operation)
            m.DRA_REQUESTS_IN_FLIGHT.labels(driver, operation)

    def dra_in_flight(self, driver: str, operation: str, claims: int) -> None:
        """Claims of kubelet calls being answered: +n when a call comes in, -n once it is answered."""
        if self._series is not None:
            self._series.DRA_REQUESTS_IN_FLIGHT.labels(driver, operation).inc(claims)

    def dra_answered(self, driver: str, operation: str, seconds: float, causes: Iterable[str]) -> None:
        """A call answered: the failure cause of each of its claims, "" for a claim that succeeded.
        Each success is a request, timed with the call's time; each failure counts under its cause."""
        m = self._series
        if m is None:
            return
        errors = m.DRA_PREPARE_ERRORS if operation == "prepare" else m.DRA_UNPREPARE_ERRORS
        for cause in causes:
            if cause:
                errors.labels(driver, cause).inc()
                continue
            m.DRA_REQUESTS.labels(driver, operation).inc()
            m.DRA_REQUEST_DURATION.labels(driver, operation).observe(seconds)

    def dra_prepared(self, node: str, driver: str, devices: Mapping[str, int]) -> None:
        """The devices prepared for claims now, by kind (gpu, mig); replaces the earlier counts."""
        if self._series is not None:
            for kind, count in devices.items():
                self._series.DRA_PREPARED_DEVICES.labels(node, driver, kind).set(count)

    # --- MPS control daemon --------------------------------------------------------------------

    def mps_daemon_ready(self, resource: str, ready: bool) -> None:
        if self._series is not None:
            self._series.MPS_DAEMON_READY.labels(resource).set(1 if ready else 0)

    def mps_daemon_start(self, resource: str, ok: bool) -> None:
        if self._series is not None:
            self._series.MPS_DAEMON_STARTS.labels(resource, "started" if ok else "failed").inc()

    def mps_daemon_restart(self, resource: str) -> None:
        if self._series is not None:
            self._series.MPS_DAEMON_RESTARTS.labels(resource).inc()

    def mps_command(self, resource: str, command: str, ok: bool) -> None:
        if self._series is not None:
            self._series.MPS_COMMANDS.labels(resource, command, "ok" if ok else "error").inc()

