"""One planned resource as the plugin runs it: its gRPC server, MPS readiness gate, health and registration.

A `RunningResource` is made for one PlannedResource under one config and inventory and is never
rebuilt in place: when it gains or loses its MPS gate, or a setting its server was built with
changes, the manager stops it and makes a new one. Device lists, health and a switch between plain
and time-slicing change through `update()`: the open ListAndWatch stream sends the new list.

Its own thread does the slow work, so no caller waits on the kubelet or the MPS daemon: wait for the
gate, start the server, register, and again whenever `kick()` says the kubelet restarted. A failing
step is logged once and retried every `retry_interval_s`; an unexpected exception is logged with its
traceback and retried too, so the resource never stays half-alive without a word.

A registration counts only if no kick came while it was under way: the kubelet that answered may be
the one that just went away (and took the socket with it). Once registered, the thread still checks
every `socket_check_s` that its socket is in place (one stat): a socket removed behind its back, or
left dead by a newer instance that took the path over and then died, is served again and registered
again without waiting for a kick. A newer instance's live socket at the path is left alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from msgspec.structs import replace

from nvdp.config.model import Config
from nvdp.daemon.guard import guarded_thread
from nvdp.daemon.owned_socket import SocketState
from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Inventory
from nvdp.plan.model import PlannedResource


class ResourceServerLike(Protocol):
    socket_path: str

    def start(self) -> None: ...
    def socket_state(self) -> SocketState: ...
    def register(self, kubelet_socket: str, timeout: float = ...) -> None: ...
    def update(self, resource: PlannedResource) -> None: ...
    def set_cdi_classes(self, classes: frozenset[str]) -> None: ...
    def wait_delivered(self, timeout: float) -> None: ...
    def stop(self) -> None: ...


class ReadinessGate(Protocol):
    """Holds a resource back until something it depends on is ready (the MPS control daemon)."""

    def wait_until_ready(self, stop: threading.Event | None = None) -> bool: ...
    def watch(self, on_change: Callable[[bool], None], ready: bool = True) -> None: ...
    def close(self) -> None: ...


ServerFactory = Callable[[PlannedResource, Config, Inventory, logging.Logger, Recorder], ResourceServerLike]
GateFactory = Callable[[PlannedResource, Config, logging.Logger, Recorder], "ReadinessGate | None"]


def default_server_factory(
    resource: PlannedResource, config: Config, inventory: Inventory, log: logging.Logger, recorder: Recorder
) -> ResourceServerLike:
    from nvdp.plugin.server import ResourceServer

    return ResourceServer(resource, config, inventory, logger=log, recorder=recorder)


def default_gate_factory(
    resource: PlannedResource, config: Config, log: logging.Logger, recorder: Recorder
) -> ReadinessGate | None:
    if resource.sharing != "mps":
        return None
    from nvdp.plugin.mps_gate import MpsGate

    return MpsGate.from_env(resource.name, log, recorder=recorder)


class RunningResource:
    """Server, gate, health and registration of one resource. Thread-safe."""

    def __init__(
        self,
        resource: PlannedResource,
        config: Config,
        inventory: Inventory,
        log: logging.Logger,
        *,
        recorder: Recorder,
        server_factory: ServerFactory = default_server_factory,
        gate_factory: GateFactory = default_gate_factory,
        retry_interval_s: float = 2.0,
        register_timeout_s: float = 5.0,
        socket_check_s: float = 1.0,
        cdi_classes: frozenset[str] = frozenset(),
    ) -> None:
        self.name = resource.name
        self.sharing = resource.sharing
        self._log = log
        self._kubelet_socket = config.flags.plugin.kubelet_socket_path
        self._retry_interval_s = retry_interval_s
        self._register_timeout_s = register_timeout_s
        self._socket_check_s = socket_check_s
        self._lock = threading.RLock()
        self._planned = resource
        self._sent = resource  # what the server holds: the factory built it with this
        self._ready = True  # what the gate says once open; False: every device is reported Unhealthy
        self._started = False
        self._registered = False
        self._kicks = 0  # kubelet restarts so far: a registration begun before the last one is void
        self._complained = False
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._first_attempt = threading.Event()  # the first start-and-register attempt is over
        self._thread: threading.Thread | None = None
        self.server = server_factory(resource, config, inventory, log, recorder)
        self.server.set_cdi_classes(cdi_classes)  # before it serves: Allocate names only specs written
        self.gate = gate_factory(resource, config, log, recorder)
        self._gate_open = self.gate is None

    # --- what the manager sees --------------------------------------------------------------------

    @property
    def registered(self) -> bool:
        with self._lock:
            return self._registered

    def wait_first_attempt(self, timeout: float) -> bool:
        """Until the first attempt to start and register is over (either way), or `timeout` passed."""
        return self._first_attempt.wait(timeout)

    @property
    def pending(self) -> bool:
        """Not yet started or registered (the gate may be holding it back)."""
        with self._lock:
            return not (self._started and self._registered)

    def served(self) -> PlannedResource:
        """The resource as the kubelet should see it: plan health, and all Unhealthy while not ready."""
        with self._lock:
            if self._ready:
                return self._planned
            devices = tuple(replace(d, healthy=False) for d in self._planned.devices)
            return replace(self._planned, devices=devices)

    # --- what the manager does --------------------------------------------------------------------

    def start(self) -> None:
        """Begin the background work: gate, server, registration."""
        if self._thread is None:
            self._thread = guarded_thread(self._run, f"resource {self.name}", self._log,
                                          f"The thread serving {self.name}")
            self._thread.start()

    def update(self, resource: PlannedResource) -> None:
        """New devices, health or sharing (not to or from MPS) for the same resource; open streams
        resend the list."""
        with self._lock:
            self.sharing = resource.sharing
            self._planned = resource
            self._push()

    def set_cdi_classes(self, classes: frozenset[str]) -> None:
        """The CDI specs written changed (a re-plan): Allocate names only the classes in `classes`."""
        self.server.set_cdi_classes(classes)

    def wait_delivered(self, timeout: float) -> None:
        """Until the kubelet's stream has the devices as they are now (no stream: at once), or `timeout`."""
        self.server.wait_delivered(timeout)

    def kick(self) -> None:
        """The kubelet restarted: register again, restarting the server if its socket was removed."""
        with self._lock:
            self._registered = False
            self._kicks += 1
            self._complained = False
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Stop the gate, the server (its socket is removed) and the background work; safe twice."""
        self._stopping.set()
        self._wake.set()
        if self.gate is not None:
            # Not under self._lock: close() joins the gate's watcher, which may be waiting for it.
            self.gate.close()
        with self._lock:
            self._started = self._registered = False
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # A start or registration in flight ends within its own timeout: do not wait it out. If a
            # start completes after this, the thread sees _stopping and stops that server itself.
            thread.join(0.2)
        self._stop_server()

    # --- the background thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.gate is not None and not self._wait_for_gate(self.gate):
                return
            while not self._stopping.is_set():
                # Cleared before the work, not after: a kick during the work is not lost.
                self._wake.clear()
                try:
                    self._step()
                except Exception:
                    self._log.exception("%s: unexpected error while serving; retrying in %gs",
                                        self.name, self._retry_interval_s)
                self._first_attempt.set()
                self._wake.wait(self._retry_interval_s if self.pending else self._socket_check_s)
        finally:
            self._first_attempt.set()

    def _wait_for_gate(self, gate: ReadinessGate) -> bool:
        while not self._stopping.is_set():
            try:
                if not gate.wait_until_ready():
                    return False
            except Exception:
                self._log.exception("%s: checking readiness failed; checking again in %gs",
                                    self.name, self._retry_interval_s)
                self._stopping.wait(self._retry_interval_s)
                continue
            with self._lock:
                if self._stopping.is_set():
                    return False
                self._gate_open = True
                gate.watch(self._set_ready)
            return True
        return False

    def _set_ready(self, ready: bool) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._ready = ready
            self._push()

    def _step(self) -> None:
        with self._lock:
            started, registered, kicks = self._started, self._registered, self._kicks
        if started:
            state = self.server.socket_state()
            if state in ("gone", "stale"):
                why = "was removed" if state == "gone" else "was replaced by a socket nobody serves"
                self._log.info("%s: %s %s; serving it again", self.name, self.server.socket_path, why)
                self.server.stop()
                with self._lock:
                    self._started = self._registered = False
                started = registered = False
        if not started and not self._start_server():
            return
        if not registered:
            self._register(kicks)

    def _start_server(self) -> bool:
        try:
            self.server.start()
        except Exception as err:
            self._complain(self._log.error, "%s: cannot start its gRPC server: %s; retrying every %gs",
                           self.name, err, self._retry_interval_s)
            return False
        with self._lock:
            if self._stopping.is_set():
                stopped = True
            else:
                stopped = False
                self._started = True
                self._complained = False
                self._push()  # health may have changed while it was starting
        if stopped:
            self._stop_server()
            return False
        return True

    def _register(self, kicks: int) -> None:
        """Register; it counts only if the kubelet did not restart since `kicks` was read."""
        try:
            self.server.register(self._kubelet_socket, timeout=self._register_timeout_s)
        except Exception as err:
            self._complain(
                self._log.warning,
                "%s: not registered with the kubelet yet: %s; retrying every %gs and when %s appears",
                self.name, err, self._retry_interval_s, self._kubelet_socket,
            )
            return
        with self._lock:
            if not self._stopping.is_set() and self._kicks == kicks:
                self._registered = True
                self._complained = False

    # --- helpers (self._lock held where said) ------------------------------------------------------

    def _complain(self, log: Callable[..., None], message: str, *args: object) -> None:
        """One line per failure streak; the repeats go to debug."""
        with self._lock:
            first = not self._complained
            self._complained = True
        (log if first else self._log.debug)(message, *args)

    def _push(self) -> None:
        """Hand the served list to the server when it differs from what it has (lock held)."""
        served = self.served()
        if served != self._sent:
            self.server.update(served)
            self._sent = served

    def _stop_server(self) -> None:
        try:
            self.server.stop()
        except Exception as err:
            self._log.error("%s: stopping its server failed: %s", self.name, err)
