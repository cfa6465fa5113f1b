"""The MPS image's side of the orders: the daemons the DRA plugin ordered, started, retuned and stopped.

`reconcile` is one pass over `<root>/<driver>/orders` (nvdp.mps.ordered.orders): a daemon whose order
is gone stops (compute mode back to DEFAULT), an order without a daemon starts one, and an order with a
new generation retunes the running daemon in place (the same process: its MPS server and clients stay),
each outcome written to the daemon's `applied.json` for the DRA plugin to wait on. The daemons are the
same supervised `ResourceDaemon`s as in device-plugin mode (probes, restarts, status file, readiness
marker). After this process restarts, its first pass finds the orders left on disk and starts them
again; the clients of the old servers reconnect.

Only what it made is touched: the daemons' folders (`applied.json`, and the DRA plugin's `limits.json`
of a daemon whose order was withdrawn); the orders are the DRA plugin's and stay on disk.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from nvdp.daemon.report.recording import Recorder
from nvdp.mps.commands import MpsSettings
from nvdp.mps.compute_mode import ComputeModes
from nvdp.mps.control import MpsCommandError
from nvdp.mps.node.host_setup import clean_up
from nvdp.mps.ordered.orders import (
    Applied,
    DaemonOrder,
    applied_path,
    read_orders,
    remove_applied,
    write_applied,
)
from nvdp.mps.paths import HOST_ROOT_ENV, ResourcePaths
from nvdp.mps.supervisor import ResourceDaemon

# The DRA plugin's record of a daemon's ceiling for nvdp doctor (nvdp.dra.claims.sharing.mps_limits,
# which nvdp.mps may not import): stale once the daemon stops, so it goes with it.
LIMITS_FILE = "limits.json"


class ModesUnavailable(Exception):
    """GPU compute modes cannot be set on this node (NVML): no daemon can start; the message says why."""


class _Running:
    """A daemon this process runs, and what it did with its order."""

    def __init__(self, daemon: ResourceDaemon, order: DaemonOrder) -> None:
        self.daemon = daemon
        self.handled = order  # the last order acted on
        self.refused = False  # its last retune was refused: the daemon may hold part of those limits
        self.unwritten: Applied | None = Applied(order.generation)  # the outcome not yet on disk
        self.write_problem: str | None = None  # logged once per distinct cause


class OrderedDaemons:
    """The daemons of one DRA driver's orders under `root` (the MPS root as this container sees it)."""

    def __init__(self, root: Path, driver: str, modes_factory: Callable[[], ComputeModes],
                 log: logging.Logger, probe_interval_s: float, *, recorder: Recorder) -> None:
        self.root = root
        self.driver = driver
        self.modes_factory = modes_factory
        self.log = log
        self.probe_interval_s = probe_interval_s
        self.recorder = recorder
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()  # guards _running against names() from other threads
        self._modes: ComputeModes | None = None
        self._unrestored = False  # a compute mode stayed changed after a daemon stopped
        self._stopped = False

    def names(self) -> dict[str, int]:
        """The running daemons: name -> pid of the control daemon (0 while it has none)."""
        with self._lock:
            return {name: running.daemon.pid or 0 for name, running in self._running.items()}

    def reconcile(self) -> None:
        """One pass: the running daemons made to match the orders on disk. ModesUnavailable when a
        daemon must start and NVML cannot set compute modes (no other daemon runs then)."""
        if self._stopped:
            return
        orders = read_orders(self.root, self.driver)
        # Stops first: a GPU serves one MPS server, so a daemon going must be gone before one comes.
        for name in sorted(self.names()):
            order = orders.get(name)
            if order is None:
                self._guarded(name, "stopping", partial(self._stop, name, "its order was withdrawn"))
            elif order.settings.gpus != self._running[name].daemon.settings.gpus:
                self._guarded(name, "restarting", partial(self._stop, name, "its order names other GPUs",
                                                          withdrawn=False))
        if not self._running:
            self._close_modes()
        for name, order in orders.items():
            running = self._running.get(name)
            if running is None:
                self._guarded(name, "starting", partial(self._start, order))
                continue
            # The settings count as well as the generation: a withdrawn order written again starts over
            # at generation 1, which this pass may see without ever seeing it withdrawn.
            if (order.generation, order.settings) != (running.handled.generation, running.handled.settings):
                self._guarded(name, "retuning", partial(self._retune, running, order))
            if running.unwritten is not None:
                self._guarded(name, "recording", partial(self._write_applied, running))

    def stop(self, *, clean_up_host: bool = True) -> bool:
        """The final stop: every daemon stopped, compute modes back to DEFAULT, the host state of a
        running daemon cleaned up (nvdp.mps.node.host_setup.clean_up, the tmpfs at `<MPS root>/<driver>/shm`
        included) unless `clean_up_host` is False (a new pod takes over and shares it). The orders
        stay: they are the DRA plugin's. False when a compute mode stayed changed,
        now or when an earlier daemon stopped. Only the first call does anything."""
        if self._stopped:
            return not self._unrestored
        self._stopped = True
        settings: list[MpsSettings] = []
        for name in sorted(self.names()):
            settings.append(self._running[name].daemon.settings)
            self._guarded(name, "stopping", partial(self._stop, name, "shutting down", withdrawn=False))
        self._close_modes()
        if not clean_up_host:
            return not self._unrestored
        host_root = os.environ.get(HOST_ROOT_ENV) or str(self.root)
        try:
            clean_up(settings, self.root, f"{host_root.rstrip('/')}/{self.driver}")
        except Exception:
            self.log.exception("unexpected error cleaning up the MPS daemons' host state")
        return not self._unrestored

    # --- inside ------------------------------------------------------------------------------------

    def _guarded(self, name: str, what: str, step: Callable[[], None]) -> None:
        """One daemon's step; its failure is logged and leaves the others alone (ModesUnavailable,
        which no daemon escapes, goes on)."""
        try:
            step()
        except ModesUnavailable:
            raise
        except Exception:
            self.log.exception("%s: unexpected error %s the MPS control daemon", name, what)

    def _modes_now(self) -> ComputeModes:
        # Opened with the first daemon, closed after the last: a node without MPS claims keeps NVML shut.
        if self._modes is None:
            try:
                self._modes = self.modes_factory()
            except Exception as err:
                raise ModesUnavailable(str(err)) from err
        return self._modes

    def _close_modes(self) -> None:
        modes, self._modes = self._modes, None
        if modes is not None:
            try:
                modes.close()
            except Exception:
                self.log.exception("unexpected error closing NVML")

    def _start(self, order: DaemonOrder) -> None:
        paths = ResourcePaths(self.root, order.name)
        daemon = ResourceDaemon(order.settings, paths, self._modes_now(), self.log, self.probe_interval_s,
                                recorder=self.recorder)
        self.log.info("Starting the MPS control daemon %s (order generation %d, claims %s)",
                      order.settings.describe(), order.generation, ", ".join(order.claims) or "none")
        running = _Running(daemon, order)
        with self._lock:
            self._running[order.name] = running
        # Not waited for: the DRA plugin waits for the ready marker itself, and other orders go on.
        daemon.start()
        self._write_applied(running)

    def _retune(self, running: _Running, order: DaemonOrder) -> None:
        daemon = running.daemon
        running.handled = order
        if order.settings == daemon.settings and not running.refused:
            running.unwritten = Applied(order.generation)  # only its claims changed
            return
        self.log.info("%s: new ceiling ordered (generation %d, claims %s)", order.name, order.generation,
                      ", ".join(order.claims) or "none")
        try:
            daemon.retune(order.settings)
        except MpsCommandError as err:
            # The daemon keeps what it had; the DRA plugin fails the prepare that asked for more.
            self.log.error("%s: the new ceiling (generation %d) was refused: %s", order.name,
                           order.generation, err)
            running.refused = True
            running.unwritten = Applied(order.generation, error=str(err))
            return
        running.refused = False
        running.unwritten = Applied(order.generation)

    def _write_applied(self, running: _Running) -> None:
        applied = running.unwritten
        assert applied is not None
        try:
            write_applied(running.daemon.paths.base, applied)
        except OSError as err:
            # Tried again on the next pass; the daemon's own status file says more about its root.
            if str(err) != running.write_problem:
                self.log.warning("%s: cannot record order generation %d as carried out: %s",
                                 running.daemon.name, applied.generation, err)
            running.write_problem = str(err)
            return
        running.unwritten = running.write_problem = None

    def _stop(self, name: str, why: str, *, withdrawn: bool = True) -> None:
        with self._lock:
            running = self._running.pop(name)
        daemon = running.daemon
        self.log.info("%s: %s; stopping its MPS control daemon", name, why)
        if not daemon.stop():
            self._unrestored = True
            self.log.error("%s: the compute mode of %s could not be restored to DEFAULT", name,
                           ", ".join(daemon.uuids))
        if withdrawn:
            # Nothing is carried out for it any more; a new order of the same name starts afresh.
            try:
                remove_applied(daemon.paths.base)
                (daemon.paths.base / LIMITS_FILE).unlink(missing_ok=True)
            except OSError as err:
                self.log.warning("%s: cannot remove %s: %s", name, applied_path(daemon.paths.base), err)
