"""One supervised `nvidia-cuda-mps-control -d` per MPS-shared resource.

Start: EXCLUSIVE_PROCESS compute mode on the resource's GPUs, pipe and log directories, the daemon,
its commands, then the readiness marker once it answers. While running, it is probed; a daemon that
exits or stops answering loses its marker and is started again after a growing pause.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from nvdp import recording
from nvdp.mps import control
from nvdp.mps.commands import MpsSettings
from nvdp.mps.compute_mode import ComputeModeError, ComputeModes
from nvdp.mps.logtail import LogTail
from nvdp.mps.paths import ResourcePaths

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
# A daemon that stayed up this long is considered recovered: the next failure waits 1 s again.
BACKOFF_RESET_AFTER_S = 60.0
DEFAULT_PROBE_INTERVAL_S = 2.0
QUIT_WAIT_S = 5.0


class Backoff:
    """1 s, 2 s, 4 s, ... capped at 30 s."""

    def __init__(self, first_s: float = BACKOFF_FIRST_S, max_s: float = BACKOFF_MAX_S) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self._next = first_s

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.first_s


def process_alive(pid: int) -> bool:
    # The daemon detaches, so it is our child only when we are the container's PID 1; reap it then,
    # or a dead daemon would linger as a zombie that looks alive.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class ResourceDaemon:
    def __init__(
        self,
        settings: MpsSettings,
        paths: ResourcePaths,
        modes: ComputeModes,
        log: logging.Logger,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        backoff: Backoff | None = None,
    ) -> None:
        self.settings = settings
        self.paths = paths
        self.modes = modes
        self.log = log
        self.probe_interval_s = probe_interval_s
        self.backoff = backoff or Backoff()
        self.pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tail = LogTail(paths.control_log, settings.resource_name, log, skip=control.PROBE_COMMAND)
        self.env = control.control_env(paths.pipe_dir, paths.log_dir, settings.visible_devices)

    @property
    def name(self) -> str:
        return self.settings.resource_name

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.settings.gpus]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name=f"mps {self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Quit the daemon, restore compute modes, remove the marker. Safe to call more than once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._remove_marker()
        self._quit()
        try:
            self.modes.restore(self.uuids)
            self.log.info("%s: compute mode of %s restored to DEFAULT", self.name, ", ".join(self.uuids))
        except ComputeModeError as err:
            self.log.error("%s: %s", self.name, err)
        self._tail.stop()

    def _supervise(self) -> None:
        while not self._stop.is_set():
            try:
                self._launch()
            except (control.MpsCommandError, ComputeModeError, OSError) as err:
                recording.mps_daemon_start(self.name, False)
                recording.mps_daemon_ready(self.name, False)
                recording.mps_daemon_restart(self.name)
                delay = self.backoff.next()
                self.log.error(
                    "%s: MPS control daemon did not start: %s; retrying in %gs", self.name, err, delay
                )
                self._remove_marker()
                self._kill()
                self._stop.wait(delay)
                continue
            recording.mps_daemon_start(self.name, True)
            recording.mps_daemon_ready(self.name, True)
            problem = self._watch()
            if problem is None:
                return
            recording.mps_daemon_ready(self.name, False)
            recording.mps_daemon_restart(self.name)
            self._remove_marker()
            self._kill()
            delay = self.backoff.next()
            self.log.warning("%s: %s; restarting it in %gs", self.name, problem, delay)
            self._stop.wait(delay)

    def _launch(self) -> None:
        too_long = self.paths.socket_path_problem()
        if too_long is not None:
            raise control.MpsCommandError(too_long)
        self.modes.set_exclusive(self.uuids)
        self._remove_marker()
        for directory in (self.paths.pipe_dir, self.paths.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._tail.start()
        control.start_daemon(self.env)
        self.pid = self._read_pid()
        self.log.info(
            "%s: MPS control daemon started (pid %s) on %s",
            self.name,
            self.pid if self.pid is not None else "unknown",
            self.settings.visible_devices,
        )
        output = self._send(self.settings.commands)
        if output:
            self.log.warning("%s: the MPS control daemon answered its settings with: %s", self.name, output)
        self._probe()
        self.paths.ready_marker.write_text(f"{self.pid or ''}\n")
        self.log.info("%s: ready (%s)", self.name, self.paths.ready_marker)

    def _watch(self) -> str | None:
        """Probe until stopped (None) or the daemon fails (what went wrong)."""
        ready_at = time.monotonic()
        while not self._stop.wait(self.probe_interval_s):
            if self.pid is not None and not process_alive(self.pid):
                return f"MPS control daemon (pid {self.pid}) exited"
            try:
                self._probe()
            except control.MpsCommandError as err:
                return f"MPS control daemon (pid {self.pid}) stopped answering: {err}"
            if time.monotonic() - ready_at >= BACKOFF_RESET_AFTER_S:
                self.backoff.reset()
        return None

    def _send(self, commands: Sequence[str]) -> str:
        try:
            output = control.send_commands(commands, self.env).strip()
        except control.MpsCommandError:
            for command in commands:
                recording.mps_command(self.name, command.split()[0], False)
            raise
        for command in commands:
            recording.mps_command(self.name, command.split()[0], True)
        return output

    def _probe(self) -> None:
        try:
            control.probe(self.paths.pipe_dir)
        except control.MpsCommandError:
            recording.mps_command(self.name, control.PROBE_COMMAND, False)
            raise
        recording.mps_command(self.name, control.PROBE_COMMAND, True)

    def _read_pid(self) -> int | None:
        try:
            return int(self.paths.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _remove_marker(self) -> None:
        self.paths.ready_marker.unlink(missing_ok=True)

    def _quit(self) -> None:
        alive = self.pid is not None and process_alive(self.pid)
        # Without a pid (no pid file) the socket is the only sign of a daemon worth telling to quit.
        if not alive and (self.pid is not None or not self.paths.control_socket.exists()):
            return
        try:
            self._send(["quit"])
        except control.MpsCommandError as err:
            self.log.warning("%s: quit was not accepted: %s", self.name, err)
        deadline = time.monotonic() + QUIT_WAIT_S
        while self.pid is not None and process_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._kill()
        self.log.info("%s: MPS control daemon stopped", self.name)

    def _kill(self) -> None:
        """End a daemon that failed or ignored quit, so a new one can take the pipe directory."""
        if self.pid is None:
            return
        if process_alive(self.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
            deadline = time.monotonic() + QUIT_WAIT_S
            while process_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.pid = None
