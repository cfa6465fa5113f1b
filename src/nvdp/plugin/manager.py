"""The plugin manager: one gRPC server per planned resource, kept registered with the kubelet.

It owns the current plan and reconciles the running servers with it:
- `apply(plan)` starts servers for new resources, stops removed ones, updates changed ones and
  leaves unchanged ones alone (a SIGHUP that changes nothing restarts nothing);
- health events mark devices Unhealthy through `Plan.with_unhealthy` and push the new lists;
- a kubelet restart (kubelet.sock created again) re-registers every resource, restarting the
  servers whose sockets the kubelet removed;
- a resource that cannot start or register yet (kubelet not up, MPS daemon not ready) is retried
  in the background, with one log line per resource, not one per attempt.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from nvdp.config.model import Config
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan, PlannedResource
from nvdp.plugin.probes import ResourceStatus

RETRY_INTERVAL_S = 2.0
REGISTER_TIMEOUT_S = 5.0


class ResourceServerLike(Protocol):
    socket_path: str

    def start(self) -> None: ...
    def register(self, kubelet_socket: str, timeout: float = ...) -> None: ...
    def update(self, resource: PlannedResource) -> None: ...
    def stop(self) -> None: ...


ServerFactory = Callable[[PlannedResource, Config, Inventory, logging.Logger], ResourceServerLike]


class ReadinessGate(Protocol):
    """Holds a resource back until something it depends on is ready (the MPS control daemon)."""

    def wait_until_ready(self, stop: threading.Event | None = None) -> bool: ...
    def watch(self, on_change: Callable[[bool], None], ready: bool = True) -> None: ...
    def close(self) -> None: ...


GateFactory = Callable[[PlannedResource, Config, logging.Logger], "ReadinessGate | None"]


def default_server_factory(
    resource: PlannedResource, config: Config, inventory: Inventory, log: logging.Logger
) -> ResourceServerLike:
    from nvdp.plugin.server import ResourceServer

    return ResourceServer(resource, config, inventory, logger=log)


def default_gate_factory(
    resource: PlannedResource, config: Config, log: logging.Logger
) -> ReadinessGate | None:
    if resource.sharing != "mps":
        return None
    from nvdp.plugin.mps_gate import MpsGate

    return MpsGate.from_env(resource.name, log)


@dataclass(frozen=True)
class PlanDiff:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # same name, other devices: the running server is updated
    restarted: tuple[str, ...] = ()  # settings the server was built with changed: a new server
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


def diff_plans(old: Plan, new: Plan, settings_changed: bool = False) -> PlanDiff:
    old_by_name = {r.name: r for r in old.resources}
    new_by_name = {r.name: r for r in new.resources}
    added = tuple(n for n in new_by_name if n not in old_by_name)
    removed = tuple(n for n in old_by_name if n not in new_by_name)
    kept = [n for n in new_by_name if n in old_by_name]
    if settings_changed:
        return PlanDiff(added=added, removed=removed, restarted=tuple(kept))
    changed = tuple(n for n in kept if new_by_name[n] != old_by_name[n])
    unchanged = tuple(n for n in kept if new_by_name[n] == old_by_name[n])
    return PlanDiff(added=added, removed=removed, changed=changed, unchanged=unchanged)


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
        server_factory: ServerFactory = default_server_factory,
        gate_factory: GateFactory = default_gate_factory,
        retry_interval_s: float = RETRY_INTERVAL_S,
        register_timeout_s: float = REGISTER_TIMEOUT_S,
    ) -> None:
        self._config = config
        self._inventory = inventory
        self._log = log
        self._server_factory = server_factory
        self._gate_factory = gate_factory
        self._retry_interval_s = retry_interval_s
        self._register_timeout_s = register_timeout_s
        self._lock = threading.RLock()
        self._work_lock = threading.Lock()  # one registration/start pass at a time
        self._plan = Plan()
        self._servers: dict[str, ResourceServerLike] = {}
        self._sent: dict[str, PlannedResource] = {}  # what each server was last given
        self._started: set[str] = set()
        self._registered: set[str] = set()
        self._complained: set[str] = set()
        self._gates: dict[str, ReadinessGate] = {}
        self._gate_threads: dict[str, threading.Thread] = {}
        self._gates_open: set[str] = set()
        self._not_ready: set[str] = set()  # gate says the dependency went away: devices Unhealthy
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._retry_thread: threading.Thread | None = None

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
            return frozenset(self._registered)

    @property
    def kubelet_socket(self) -> str:
        return self.config.flags.plugin.kubelet_socket_path

    def resource_status(self) -> list[ResourceStatus]:
        """Each planned resource: registered or not, and why an MPS gate holds it back (for /readyz)."""
        with self._lock:
            return [
                ResourceStatus(name, name in self._registered,
                               getattr(self._gates.get(name), "waiting_reason", None))
                for name in self._servers
            ]

    def started_sockets(self) -> list[tuple[str, str]]:
        """(resource, socket path) of every started server (for /healthz)."""
        with self._lock:
            return [(n, s.socket_path) for n, s in self._servers.items() if n in self._started]

    def responsive(self, timeout: float) -> bool:
        """False when the manager's lock stays taken for `timeout` seconds: something is stuck."""
        if not self._lock.acquire(timeout=timeout):
            return False
        self._lock.release()
        return True

    # --- reconciling -------------------------------------------------------------------------

    def apply(self, plan: Plan, config: Config | None = None, inventory: Inventory | None = None) -> PlanDiff:
        """Make the running servers match `plan`; registers what it can now, the rest in the background."""
        with self._lock:
            new_config = config or self._config
            new_inventory = inventory or self._inventory
            settings_changed = serving_settings(new_config) != serving_settings(self._config) or (
                new_inventory != self._inventory
            )
            diff = diff_plans(self._plan, plan, settings_changed)
            socket_moved = new_config.flags.plugin.kubelet_socket_path != self.kubelet_socket
            self._config, self._inventory, self._plan = new_config, new_inventory, plan
            for name in diff.removed + diff.restarted:
                self._stop_server(name)
            for name in diff.changed:
                self._update_server(name)
            for name in diff.added + diff.restarted:
                self._create_server(name)
            if socket_moved:
                self._registered.clear()
                self._complained.clear()
        self.process_pending()
        self._wake.set()
        return diff

    def mark_unhealthy(self, uuids: frozenset[str], reason: str) -> None:
        """Health event: every device backed by one of `uuids` turns Unhealthy, for good (until re-plan)."""
        with self._lock:
            before = self._plan
            self._plan = before.with_unhealthy(uuids)
            for new in self._plan.resources:
                old = before.resource(new.name)
                if old is None or old == new:
                    continue
                was_healthy = {d.id for d in old.devices if d.healthy}
                newly = [d.id for d in new.devices if not d.healthy and d.id in was_healthy]
                self._log.warning(
                    "%s: %d device(s) marked unhealthy (%s): %s",
                    new.name, len(newly), reason, _short_list(newly),
                )
                self._update_server(new.name)

    def kubelet_restarted(self) -> None:
        """kubelet.sock was created again: the kubelet forgot us and may have removed our sockets."""
        with self._lock:
            self._registered.clear()
            self._complained.clear()
            for name, server in list(self._servers.items()):
                if name in self._started and not os.path.exists(server.socket_path):
                    self._log.info("%s: %s was removed; restarting its server", name, server.socket_path)
                    self._stop_server(name)
                    self._create_server(name)
        self.process_pending()

    def process_pending(self) -> None:
        """Start the servers that are due and register every started, unregistered resource."""
        with self._work_lock:
            with self._lock:
                due = [n for n in self._servers if n not in self._started and self._gate_open(n)]
            for name in due:
                self._start_server(name)
            with self._lock:
                todo = [(n, self._servers[n]) for n in self._servers if n in self._started]
                todo = [(n, s) for n, s in todo if n not in self._registered]
                kubelet_socket = self.kubelet_socket
            for name, server in todo:
                self._register(name, server, kubelet_socket)

    # --- background work ---------------------------------------------------------------------

    def start_background(self) -> None:
        """Retry pending starts and registrations every retry interval (or at once when woken)."""
        if self._retry_thread is None:
            self._retry_thread = threading.Thread(target=self._retry_loop, name="plugin-retry", daemon=True)
            self._retry_thread.start()

    def wake(self) -> None:
        self._wake.set()

    def pending(self) -> bool:
        with self._lock:
            return any(n not in self._started or n not in self._registered for n in self._servers)

    def _retry_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._retry_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.pending():
                try:
                    self.process_pending()
                except Exception:  # the retry loop is what brings the plugin back: it must not die
                    self._log.exception("Retrying plugin start/registration failed")

    def stop(self) -> None:
        """Stop every server (their sockets are removed) and the background work."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            names = list(self._servers)
        for name in names:
            with self._lock:
                self._stop_server(name)
        if self._retry_thread is not None and self._retry_thread is not threading.current_thread():
            self._retry_thread.join(5.0)

    # --- per-resource steps (called with self._lock held unless said otherwise) ---------------

    def _served(self, name: str) -> PlannedResource:
        """The resource as the kubelet should see it: plan health, and all Unhealthy while not ready."""
        resource = self._plan.resource(name)
        assert resource is not None
        if name in self._not_ready:
            resource = replace(resource, devices=tuple(replace(d, healthy=False) for d in resource.devices))
        return resource

    def _create_server(self, name: str) -> None:
        resource = self._served(name)
        self._servers[name] = self._server_factory(resource, self._config, self._inventory, self._log)
        self._sent[name] = resource
        gate = self._gate_factory(resource, self._config, self._log)
        if gate is not None:
            self._open_gate_later(name, gate)

    def _gate_open(self, name: str) -> bool:
        return name not in self._gates or name in self._gates_open

    def _open_gate_later(self, name: str, gate: ReadinessGate) -> None:
        self._gates[name] = gate

        def wait() -> None:
            # The gate's own stop event ends the wait: close() sets it when the resource goes away.
            if gate.wait_until_ready():
                with self._lock:
                    if self._gates.get(name) is not gate:
                        return
                    self._gates_open.add(name)
                    gate.watch(lambda ready: self._set_ready(name, gate, ready))
                self._wake.set()

        thread = threading.Thread(target=wait, name=f"gate {name}", daemon=True)
        self._gate_threads[name] = thread
        thread.start()

    def _set_ready(self, name: str, gate: ReadinessGate, ready: bool) -> None:
        with self._lock:
            if self._gates.get(name) is not gate:
                return
            if ready:
                self._not_ready.discard(name)
            else:
                self._not_ready.add(name)
            self._update_server(name)

    def _start_server(self, name: str) -> None:
        """Start one server; called without the lock (start() waits for its socket to answer)."""
        with self._lock:
            server = self._servers.get(name)
        if server is None:
            return
        try:
            server.start()
        except Exception as err:
            with self._lock:
                first = name not in self._complained
                self._complained.add(name)
            log = self._log.error if first else self._log.debug
            log("%s: cannot start its gRPC server: %s; retrying every %gs", name, err, self._retry_interval_s)
            return
        with self._lock:
            if self._servers.get(name) is not server:  # replaced or removed meanwhile
                server.stop()
                return
            self._started.add(name)
            self._complained.discard(name)
            # Health may have changed while the server was starting.
            self._update_server(name)

    def _register(self, name: str, server: ResourceServerLike, kubelet_socket: str) -> None:
        """Register one resource; called without the lock (the kubelet may be slow to answer)."""
        try:
            server.register(kubelet_socket, timeout=self._register_timeout_s)
        except Exception as err:
            with self._lock:
                first = name not in self._complained
                self._complained.add(name)
            if first:
                self._log.warning(
                    "%s: not registered with the kubelet yet: %s; retrying every %gs and when %s appears",
                    name, err, self._retry_interval_s, kubelet_socket,
                )
            return
        with self._lock:
            if self._servers.get(name) is server:
                self._registered.add(name)
                self._complained.discard(name)

    def _update_server(self, name: str) -> None:
        server = self._servers.get(name)
        resource = self._served(name)
        if server is not None and self._sent.get(name) != resource:
            server.update(resource)
            self._sent[name] = resource

    def _stop_server(self, name: str) -> None:
        server = self._servers.pop(name, None)
        self._sent.pop(name, None)
        self._started.discard(name)
        self._registered.discard(name)
        self._complained.discard(name)
        self._not_ready.discard(name)
        self._gates_open.discard(name)
        self._gate_threads.pop(name, None)
        gate = self._gates.pop(name, None)
        if gate is not None:
            # close() joins the gate's watcher, which may be waiting for self._lock right now.
            threading.Thread(target=gate.close, name=f"close gate {name}", daemon=True).start()
        if server is not None:
            try:
                server.stop()
            except Exception as err:
                self._log.error("%s: stopping its server failed: %s", name, err)


def _short_list(ids: Iterable[str], limit: int = 4) -> str:
    items = list(ids)
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"
