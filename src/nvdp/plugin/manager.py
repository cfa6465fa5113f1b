"""The plugin manager: one RunningResource per planned resource, kept registered with the kubelet.

It owns the current plan and reconciles the running resources with it:
- `apply(plan)` starts resources that are new, stops removed ones, updates changed ones in place and
  leaves unchanged ones alone (a SIGHUP that changes nothing restarts nothing). A resource that
  gains or loses its MPS gate, or whose serving settings changed, is stopped and made anew, server
  and gate together; any other change (plain <-> time-slicing, replicas, devices, health) goes
  through the open ListAndWatch stream, with no new socket and no new registration;
- health changes set which devices are Unhealthy (`Plan.with_health`) and push the new lists; a
  re-plan keeps them, so a reload brings back no GPU that is down;
- a kubelet restart (kubelet.sock created again) makes every resource register again.
Each resource starts and registers on its own thread (see resource.py), so neither a slow kubelet
nor a missing MPS daemon holds up the caller, a signal, or the other resources.
"""

from __future__ import annotations

import logging
import threading
import time

from msgspec import Struct
from msgspec.structs import replace

from nvdp.config.model import Config
from nvdp.daemon.report.probes import ResourceStatus
from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan, PlannedResource
from nvdp.plugin.resource import (
    GateFactory,
    ReadinessGate,
    ResourceServerLike,
    RunningResource,
    ServerFactory,
    default_gate_factory,
    default_server_factory,
)
from nvdp.text import short_list

__all__ = ["GateFactory", "PlanDiff", "PluginManager", "ReadinessGate", "ResourceServerLike",
           "ServerFactory", "default_gate_factory", "default_server_factory", "diff_plans"]

RETRY_INTERVAL_S = 2.0
REGISTER_TIMEOUT_S = 5.0
# How often a registered resource checks that its socket is still in place (one stat).
SOCKET_CHECK_S = 1.0
STOP_TIMEOUT_S = 5.0
# A health event's log line waits at most this long for the kubelet's stream to send the new list.
_LOG_AFTER_DELIVERY_S = 0.05


class PlanDiff(Struct, frozen=True):
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # same name, other devices or sharing: the running resource is updated
    restarted: tuple[str, ...] = ()  # other settings, or an MPS gate to add or drop: stopped and made anew
    unchanged: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("updated", self.changed),
                ("restarted", self.restarted),
                ("unchanged", self.unchanged),
            )
            if names
        ]
        return "; ".join(parts) if parts else "no resources"


def serving_settings(config: Config) -> Config:
    """The part of a config a running server was built with; resources/sharing are in the plan."""
    return replace(config, source="", resources=type(config.resources)(), sharing=type(config.sharing)())


def needs_rebuild(old: PlannedResource, new: PlannedResource) -> bool:
    """Whether `new` cannot be served by the resource built for `old`: only MPS sharing has a gate
    (made with the resource), so only a switch to or from MPS makes a new resource. The rest of a
    sharing switch is the device list and the Allocate answers, which an update replaces in place:
    a restart would close the kubelet's stream, and the kubelet then marks every device of the
    resource Unhealthy until the new server registers.

    To or from MPS the stream closes for that moment: the new server must listen on the same socket
    path, which the old one holds until it stops.
    """
    return (old.sharing == "mps") != (new.sharing == "mps")


def diff_plans(old: Plan, new: Plan, settings_changed: bool = False) -> PlanDiff:
    old_by_name = {r.name: r for r in old.resources}
    new_by_name = {r.name: r for r in new.resources}
    added = tuple(n for n in new_by_name if n not in old_by_name)
    removed = tuple(n for n in old_by_name if n not in new_by_name)
    kept = [n for n in new_by_name if n in old_by_name]
    restarted = tuple(n for n in kept if settings_changed or needs_rebuild(old_by_name[n], new_by_name[n]))
    kept = [n for n in kept if n not in restarted]
    changed = tuple(n for n in kept if new_by_name[n] != old_by_name[n])
    unchanged = tuple(n for n in kept if new_by_name[n] == old_by_name[n])
    return PlanDiff(added=added, removed=removed, changed=changed, restarted=restarted, unchanged=unchanged)


def describe_resource(resource: PlannedResource) -> str:
    sharing = "" if resource.sharing == "none" else f", {resource.sharing} x{resource.replicas}"
    source = resource.source_name
    renamed = f", renamed from {source}" if source not in ("", resource.name) else ""
    return f"{resource.name}: {len(resource.devices)} devices{sharing}{renamed}"


class PluginManager:
    def __init__(
        self,
        config: Config,
        inventory: Inventory,
        log: logging.Logger,
        *,
        recorder: Recorder,
        server_factory: ServerFactory = default_server_factory,
        gate_factory: GateFactory = default_gate_factory,
        retry_interval_s: float = RETRY_INTERVAL_S,
        register_timeout_s: float = REGISTER_TIMEOUT_S,
        socket_check_s: float = SOCKET_CHECK_S,
        cdi_classes: frozenset[str] = frozenset(),
    ) -> None:
        self._config = config
        self._inventory = inventory
        self._log = log
        self._recorder = recorder
        self._server_factory = server_factory
        self._gate_factory = gate_factory
        self._retry_interval_s = retry_interval_s
        self._register_timeout_s = register_timeout_s
        self._socket_check_s = socket_check_s
        self._lock = threading.RLock()
        self._plan = Plan()
        self._unhealthy: frozenset[str] = frozenset()  # GPU and MIG UUIDs that are down
        self._resources: dict[str, RunningResource] = {}
        self._cdi_classes = cdi_classes  # the CDI specs written: the classes Allocate may name

    # --- read-only views ---------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        with self._lock:
            return self._plan

    @property
    def config(self) -> Config:
        with self._lock:
            return self._config

    @property
    def registered(self) -> frozenset[str]:
        with self._lock:
            resources = list(self._resources.values())
        return frozenset(r.name for r in resources if r.registered)

    @property
    def kubelet_socket(self) -> str:
        return self.config.flags.plugin.kubelet_socket_path

    def resource(self, name: str) -> RunningResource | None:
        with self._lock:
            return self._resources.get(name)

    def pending(self) -> bool:
        with self._lock:
            resources = list(self._resources.values())
        return any(r.pending for r in resources)

    def wait_first_attempts(self, timeout_s: float) -> None:
        """Until every resource has tried once to start and register (held by a gate: not yet), or
        `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            resources = list(self._resources.values())
        for running in resources:
            running.wait_first_attempt(max(0.0, deadline - time.monotonic()))

    def resource_status(self) -> list[ResourceStatus]:
        """Each planned resource: registered or not, and why an MPS gate holds it back (for /readyz)."""
        with self._lock:
            resources = list(self._resources.values())
        return [
            ResourceStatus(r.name, r.registered, getattr(r.gate, "waiting_reason", None)) for r in resources
        ]

    def sockets(self) -> list[tuple[str, str]]:
        """(resource, socket path) of every resource's server, started or not (for /healthz)."""
        with self._lock:
            return [(r.name, r.server.socket_path) for r in self._resources.values()]

    def responsive(self, timeout: float) -> bool:
        """False when the manager's lock stays taken for `timeout` seconds: something is stuck."""
        if not self._lock.acquire(timeout=timeout):
            return False
        self._lock.release()
        return True

    # --- reconciling -------------------------------------------------------------------------

    def apply(self, plan: Plan, config: Config | None = None, inventory: Inventory | None = None,
              cdi_classes: frozenset[str] | None = None) -> PlanDiff:
        """Make the running resources match `plan`; starting and registering go on in the background.

        `cdi_classes` (None: as before) are the CDI classes whose specs are written now; resources
        that keep running get them in place, so their Allocate answers name no class without a spec.
        """
        with self._lock:
            classes_changed = cdi_classes is not None and cdi_classes != self._cdi_classes
            if cdi_classes is not None:
                self._cdi_classes = cdi_classes
            new_config = config or self._config
            new_inventory = inventory or self._inventory
            settings_changed = serving_settings(new_config) != serving_settings(self._config) or (
                new_inventory != self._inventory
            )
            plan = plan.with_health(self._unhealthy)
            diff = diff_plans(self._plan, plan, settings_changed)
            self._config, self._inventory, self._plan = new_config, new_inventory, plan
            retired = [self._resources.pop(name) for name in diff.removed + diff.restarted]
            for name in diff.changed:
                self._resources[name].update(_resource(plan, name))
            if classes_changed:
                for name in diff.changed + diff.unchanged:
                    self._resources[name].set_cdi_classes(self._cdi_classes)
            fresh = [self._make(_resource(plan, name)) for name in diff.added + diff.restarted]
            for running in fresh:
                self._resources[running.name] = running
        # Outside the lock (stopping waits for gRPC's grace period), and before the new ones start:
        # a restarted resource's new server takes over the same socket path.
        _stop_all(retired, self._log)
        for running in fresh:
            running.start()
        return diff

    def set_health(self, unhealthy: frozenset[str], why: str) -> None:
        """Health changed: exactly the devices backed by one of `unhealthy` are Unhealthy from now on."""
        changed: list[tuple[RunningResource | None, PlannedResource, PlannedResource]] = []
        with self._lock:
            before = self._plan
            self._unhealthy = unhealthy
            self._plan = before.with_health(unhealthy)
            for new in self._plan.resources:
                old = before.resource(new.name)
                if old is None or old is new:  # with_health keeps an untouched resource as it was
                    continue
                running = self._resources.get(new.name)
                if running is not None:
                    running.update(new)
                changed.append((running, old, new))
        # What the log line says is worked out once the kubelet has the new list: until then the
        # stream waits for the interpreter this thread holds (about 0.1 ms for the line alone).
        for running, old, new in changed:
            if running is not None:
                running.wait_delivered(_LOG_AFTER_DELIVERY_S)
            was = {d.id: d.healthy for d in old.devices}
            down = [d.id for d in new.devices if not d.healthy and was.get(d.id, True)]
            back = [d.id for d in new.devices if d.healthy and not was.get(d.id, True)]
            if down:
                self._log.warning("%s: %d device(s) marked unhealthy (%s): %s", new.name, len(down), why,
                                  short_list(down))
            if back:
                self._log.info("%s: %d device(s) healthy again (%s): %s", new.name, len(back), why,
                               short_list(back))

    def kubelet_restarted(self) -> None:
        """kubelet.sock was created again: the kubelet forgot us and may have removed our sockets."""
        with self._lock:
            resources = list(self._resources.values())
        for running in resources:
            running.kick()

    def wake(self) -> None:
        """Retry pending starts and registrations now rather than at the next retry interval."""
        with self._lock:
            resources = list(self._resources.values())
        for running in resources:
            running.wake()

    def stop(self) -> None:
        """Stop every resource (their sockets are removed), all at once."""
        with self._lock:
            retired = list(self._resources.values())
            self._resources.clear()
        _stop_all(retired, self._log)

    def _make(self, resource: PlannedResource) -> RunningResource:
        return RunningResource(
            resource, self._config, self._inventory, self._log, recorder=self._recorder,
            server_factory=self._server_factory, gate_factory=self._gate_factory,
            retry_interval_s=self._retry_interval_s, register_timeout_s=self._register_timeout_s,
            socket_check_s=self._socket_check_s, cdi_classes=self._cdi_classes,
        )


def _resource(plan: Plan, name: str) -> PlannedResource:
    resource = plan.resource(name)
    assert resource is not None
    return resource


def _stop_all(resources: list[RunningResource], log: logging.Logger) -> None:
    """Stop resources in parallel: each waits up to gRPC's grace period for its calls to finish."""
    if len(resources) == 1:
        resources[0].stop()
        return
    threads = [threading.Thread(target=r.stop, name=f"stop {r.name}", daemon=True) for r in resources]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            log.warning("%s did not finish within %gs; going on", thread.name, STOP_TIMEOUT_S)

