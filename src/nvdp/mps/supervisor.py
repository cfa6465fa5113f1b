"""One supervised `nvidia-cuda-mps-control -d` per MPS-shared resource.

Start: EXCLUSIVE_PROCESS compute mode on the resource's GPUs, pipe and log directories, the daemon,
its commands, then the readiness marker once it answers. While running, it is probed; a daemon that
exits or stops answering loses its marker and is started again after a growing pause.

The supervising thread never ends on an error: every failed attempt is logged with its cause and
fix and published in the resource's status file (`nvdp.mps.status`) for the plugin, then retried.
`stop()` restores the compute mode whatever else fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from nvdp.daemon.report.recording import Recorder
from nvdp.mps import control
from nvdp.mps.commands import MpsSettings
from nvdp.mps.compute_mode import ComputeModeError, ComputeModes
from nvdp.mps.logtail import LogTail, max_bytes_from_env
from nvdp.mps.paths import ResourcePaths, unusable_root, unusable_root_message
from nvdp.mps.status import REFRESH_S, State, write_status

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
# A daemon that stayed up this long is considered recovered: the next failure waits 1 s again.
BACKOFF_RESET_AFTER_S = 60.0
DEFAULT_PROBE_INTERVAL_S = 2.0
QUIT_WAIT_S = 5.0


def unexpected(answer: str) -> str:
    """The part of the daemon's answer to settings that is not an echo: the real daemon answers a thread
    percentage it was set to with the value ("25.0"), and says nothing to a memory limit."""
    lines = []
    for line in answer.splitlines():
        try:
            float(line)
        except ValueError:
            lines.append(line)
    return "\n".join(lines).strip()


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
        *,
        recorder: Recorder,
    ) -> None:
        self.settings = settings
        self.paths = paths
        self.modes = modes
        self.log = log
        self.recorder = recorder
        self.probe_interval_s = probe_interval_s
        self.backoff = backoff or Backoff()
        self.pid: int | None = None
        self.last_error: str | None = None
        self._status_problem: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._settings_lock = threading.Lock()
        self._tail = LogTail(
            paths.control_log,
            settings.resource_name,
            log,
            skip=control.PROBE_COMMAND,
            max_bytes=max_bytes_from_env(),
        )
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

    def retune(self, settings: MpsSettings) -> None:
        """New limits (a DRA daemon's ceiling, as its claims come and go) for the same GPUs. A daemon
        that answers gets them now: as its defaults, and for each MPS server it runs, so that their
        next clients are held to them; one that does not yet gets them when it starts.
        MpsCommandError when the running daemon did not take them."""
        with self._settings_lock:
            self.settings = settings
            if not self.paths.ready_marker.exists():
                return
            listed = self._send(["get_server_list"])
            servers = [line.strip() for line in listed.splitlines() if line.strip().isdigit()]
            output = unexpected(self._send(settings.retune_commands(servers)))
        if output:
            raise control.MpsCommandError(f"the MPS control daemon answered its new limits with: {output}")
        self.log.info("New limits for the MPS control daemon %s", settings.describe())

    def stop(self) -> bool:
        """Quit the daemon, restore compute modes, remove the marker. Safe to call more than once.

        Each step runs whatever the others did; False when the compute mode could not be restored,
        the one failure that leaves the node worse than before.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        restored = True
        try:
            self._remove_marker()
            self._guarded("stopping the MPS control daemon", self._quit)
        finally:
            try:
                self.modes.restore(self.uuids)
                self.log.info("%s: compute mode of %s restored to DEFAULT", self.name, ", ".join(self.uuids))
            except ComputeModeError as err:
                self.log.error("%s: %s", self.name, err)
                restored = False
            except Exception:
                self.log.exception("%s: unexpected error restoring the compute mode", self.name)
                restored = False
            self._publish("stopped", None)
            self._tail.stop()
        return restored

    def _guarded(self, what: str, step: Callable[[], object]) -> None:
        try:
            step()
        except (control.MpsCommandError, OSError) as err:
            self.log.warning("%s: %s failed: %s", self.name, what, err)
        except Exception:
            self.log.exception("%s: unexpected error %s", self.name, what)

    def _supervise(self) -> None:
        while not self._stop.is_set():
            try:
                failure = self._attempt()
            except Exception as err:  # a bug must not end supervision silently
                self.log.exception("%s: unexpected error supervising the MPS control daemon", self.name)
                self._guarded("cleaning up", self._clean_up)
                failure = (f"unexpected error: {type(err).__name__}: {err}", False)
            if failure is None:
                return
            problem, was_running = failure
            self._publish("failing", problem)
            if not was_running:
                self.recorder.mps_daemon_start(self.name, False)
            self.recorder.mps_daemon_ready(self.name, False)
            self.recorder.mps_daemon_restart(self.name)
            delay = self.backoff.next()
            if was_running:
                self.log.warning("%s: %s; restarting it in %gs", self.name, problem, delay)
            else:
                self.log.error("%s: %s; retrying in %gs", self.name, problem, delay)
            self._pause(delay)

    def _attempt(self) -> tuple[str, bool] | None:
        """One launch and watch: None once stopped, else what failed and whether the daemon had
        been ready (it is cleaned up either way)."""
        try:
            self._launch()
        except (control.MpsCommandError, ComputeModeError, OSError) as err:
            self._clean_up()
            return f"MPS control daemon did not start: {self._explain(err)}", False
        problem = self._watch()
        if problem is None:
            return None
        self._clean_up()
        return problem, True

    def _explain(self, err: BaseException) -> str:
        if isinstance(err, OSError):
            blocked = unusable_root(self.paths.root, self.paths.base)
            if blocked is not None:
                return unusable_root_message(self.paths.root, blocked)
        return str(err)

    def _clean_up(self) -> None:
        self._remove_marker()
        self._guarded("ending the failed MPS control daemon", self._kill)

    def _pause(self, delay: float) -> None:
        """Wait `delay` (or until stopped), keeping the published status fresh."""
        deadline = time.monotonic() + delay
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._stop.wait(min(left, REFRESH_S)):
                return
            if self.last_error is not None and time.monotonic() < deadline:
                self._publish("failing", self.last_error)

    def _publish(self, state: State, error: str | None) -> None:
        """Write the status file; a failure is logged once per distinct cause, never raised."""
        if state == "failing":
            self.last_error = error
        elif state == "ready":
            self.last_error = None
        try:
            self.paths.base.mkdir(parents=True, exist_ok=True)
            write_status(self.paths.status_file, state, error)
        except OSError as err:
            problem = str(err)
            if problem != self._status_problem:
                self.log.warning(
                    "%s: cannot publish the daemon status at %s for the plugin: %s",
                    self.name,
                    self.paths.status_file,
                    self._explain(err),
                )
            self._status_problem = problem
            return
        self._status_problem = None

    def _launch(self) -> None:
        too_long = self.paths.socket_path_problem()
        if too_long is not None:
            raise control.MpsCommandError(too_long)
        if self.last_error is None:
            # While retrying after a failure the status stays "failing", with that error.
            self._publish("starting", None)
        self.modes.set_exclusive(self.uuids)
        if not self._remove_marker():
            raise control.MpsCommandError(
                f"the ready marker {self.paths.ready_marker} of an earlier daemon cannot be removed"
            )
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
        with self._settings_lock:  # a retune meanwhile either comes before the defaults or after the marker
            output = unexpected(self._send(self.settings.commands))
            if output:
                self.log.warning("%s: the MPS control daemon answered its settings with: %s", self.name,
                                 output)
            self._probe()
            self.paths.ready_marker.write_text(f"{self.pid or ''}\n")
        self._publish("ready", None)
        self.recorder.mps_daemon_start(self.name, True)
        self.recorder.mps_daemon_ready(self.name, True)
        self.log.info("%s: ready (%s)", self.name, self.paths.ready_marker)

    def _watch(self) -> str | None:
        """Probe until stopped (None) or the daemon fails (what went wrong)."""
        ready_at = published_at = time.monotonic()
        while not self._stop.wait(self.probe_interval_s):
            if time.monotonic() - published_at >= REFRESH_S:
                self._publish("ready", None)
                published_at = time.monotonic()
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
                self.recorder.mps_command(self.name, command.split()[0], False)
            raise
        for command in commands:
            self.recorder.mps_command(self.name, command.split()[0], True)
        return output

    def _probe(self) -> None:
        try:
            control.probe(self.paths.pipe_dir)
        except control.MpsCommandError:
            self.recorder.mps_command(self.name, control.PROBE_COMMAND, False)
            raise
        self.recorder.mps_command(self.name, control.PROBE_COMMAND, True)

    def _read_pid(self) -> int | None:
        try:
            return int(self.paths.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _remove_marker(self) -> bool:
        """Remove the ready marker; False (logged) when a marker stays behind."""
        try:
            self.paths.ready_marker.unlink(missing_ok=True)
        except NotADirectoryError:
            return True  # a file in the way of the resource directory: there is no marker
        except OSError as err:
            self.log.error(
                "%s: cannot remove the ready marker %s: %s",
                self.name,
                self.paths.ready_marker,
                self._explain(err),
            )
            return False
        return True

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
