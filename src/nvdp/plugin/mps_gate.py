"""The plugin's MPS readiness gate: serve an MPS resource only while its control daemon answers.

NVIDIA's plugin checks the daemon once and restarts everything on failure, which users see as a
crash loop with `error waiting for MPS daemon` and no hint that the daemon's DaemonSet only runs on
nodes labelled nvidia.com/mps.capable=true. This gate waits instead, says what is missing and how to
fix it (every 30 s, per resource), and keeps probing after start-up so the manager can report the
resource's devices Unhealthy while the daemon is away. "What is missing" is one of three: no daemon
on this node (the label fix), a daemon that runs but fails (its last error, from the status file it
publishes), or an MPS root no daemon can use (the path and the fix).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from nvdp.config.names import node_name
from nvdp.daemon.guard import guarded_loop, guarded_thread
from nvdp.daemon.report.recording import Recorder
from nvdp.mps import control
from nvdp.mps.node.handover import WaitReporter
from nvdp.mps.paths import HOST_ROOT_ENV, ResourcePaths, container_root, unusable_root, unusable_root_message
from nvdp.mps.status import DaemonStatus, read_status

MPS_CAPABLE_LABEL = "nvidia.com/mps.capable=true"
WAIT_LOG_INTERVAL_ENV = "MPS_WAIT_LOG_INTERVAL"
PROBE_INTERVAL_ENV = "MPS_PROBE_INTERVAL"
DEFAULT_WAIT_LOG_INTERVAL_S = 30.0
DEFAULT_PROBE_INTERVAL_S = 5.0
# How often the marker is looked for while waiting: cheap, and serving should start promptly.
WAIT_POLL_S = 0.5

Probe = Callable[[Path], None]  # raises control.MpsCommandError when the daemon does not answer


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


class MpsGate:
    def __init__(
        self,
        resource_name: str,
        root: Path,
        node_name: str,
        log: logging.Logger,
        interval_s: float = DEFAULT_WAIT_LOG_INTERVAL_S,
        probe: Probe = control.probe,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        host_root: str = "",
        *,
        recorder: Recorder | None = None,
    ) -> None:
        self.resource_name = resource_name
        # None: a Recorder of its own: records nowhere but its metrics.
        self.recorder = recorder if recorder is not None else Recorder()
        self.host_root = host_root
        self.paths = ResourcePaths(root, resource_name)
        self.node_name = node_name or "<node name>"
        self.log = log
        self.interval_s = interval_s
        self.probe = probe
        self.probe_interval_s = probe_interval_s
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        # What is missing while the resource is held back (readiness and Events show it); None when ready.
        self.waiting_reason: str | None = None
        self.upgrade = WaitReporter(root, self.node_name,
                                    lambda reason, message: self.recorder.event(reason, message))

    @classmethod
    def from_env(
        cls, resource_name: str, log: logging.Logger, env: Mapping[str, str] | None = None, *,
        recorder: Recorder | None = None,
    ) -> MpsGate:
        """The gate as the plugin container sees things: root /mps (MPS_CONTAINER_ROOT), NODE_NAME."""
        source = os.environ if env is None else env
        return cls(
            resource_name,
            container_root(source),
            node_name(source),
            log,
            interval_s=_seconds(source, WAIT_LOG_INTERVAL_ENV, DEFAULT_WAIT_LOG_INTERVAL_S),
            probe_interval_s=_seconds(source, PROBE_INTERVAL_ENV, DEFAULT_PROBE_INTERVAL_S),
            host_root=source.get(HOST_ROOT_ENV, ""),
            recorder=recorder,
        )

    def problem(self) -> str | None:
        """None when the daemon is ready, else what is missing and the fix, for the log."""
        not_answering: str | None = None
        if self.paths.ready_marker.exists():
            try:
                self.probe(self.paths.pipe_dir)
            except control.MpsCommandError as err:
                not_answering = str(err)
            else:
                return None
        return f"{self.resource_name}: waiting for the MPS control daemon: {self._diagnose(not_answering)}"

    def _diagnose(self, not_answering: str | None) -> str:
        blocked = unusable_root(self.paths.root, self.paths.base)
        if blocked is not None:
            return unusable_root_message(self.paths.root, blocked, self.host_root)
        status = read_status(self.paths.status_file)
        see_log = f"see the log of the MPS daemon pod on node {self.node_name}"
        if status is not None and status.is_current():
            if status.state == "failing":
                return (
                    f"the MPS daemon pod on node {self.node_name} is running but failing; its last error: "
                    f"{status.error}; {see_log}"
                )
            if status.state == "starting" or not_answering is None:
                last = f" (its last error: {status.error})" if status.error else ""
                return f"the MPS daemon pod on node {self.node_name} is starting the daemon{last}"
        if not_answering is not None:
            gone = "" if status is None or status.is_current() else f"; {_last_seen(status)}"
            return f"it does not answer at {self.paths.pipe_dir} ({not_answering}){gone}; {see_log}"
        gone = "" if status is None else f" and {_last_seen(status)}"
        return (
            f"{self.paths.ready_marker} does not exist{gone}, so the MPS daemon pod is not running on node "
            f"{self.node_name}. The chart runs it only on nodes labelled {MPS_CAPABLE_LABEL}; fix: "
            f"kubectl label node {self.node_name} {MPS_CAPABLE_LABEL}"
        )

    def is_ready(self) -> bool:
        return self.problem() is None

    def wait_until_ready(self, stop: threading.Event | None = None) -> bool:
        """Block until ready (True) or `stop` is set (False), logging the problem every interval_s."""
        stop = stop or self._stop
        last_logged: float | None = None
        waited = 0.0
        while True:
            problem = self.problem()
            self.waiting_reason = problem
            if problem is None:
                self.log.info("%s: MPS control daemon is ready", self.resource_name)
                self.recorder.mps_ready(self.resource_name, True)
                return True
            if last_logged is None:
                self.recorder.mps_ready(self.resource_name, False, problem)
            if last_logged is None or waited - last_logged >= self.interval_s:
                self.log.warning("%s", problem)
                last_logged = waited
            step = min(WAIT_POLL_S, self.interval_s)
            if stop.wait(step):
                return False
            waited += step

    def watch(self, on_change: Callable[[bool], None], ready: bool = True) -> None:
        """Probe every probe_interval_s in a thread; call on_change(ready) whenever readiness flips.

        `ready` is the state the caller already acts on (True after wait_until_ready). After close()
        the watcher ends at once: a gate is not reused.
        """

        state = ready

        def check() -> None:
            nonlocal state
            if self._stop.wait(self.probe_interval_s):
                return
            try:
                problem = self.problem()
            except Exception as err:
                # Checking itself failed (a filesystem error under the MPS root, say): not ready, and
                # the next probe tries again; guarded_loop would only log it and leave the state.
                self.log.exception("%s: checking the MPS control daemon failed", self.resource_name)
                problem = f"{self.resource_name}: checking the MPS control daemon failed: {err}"
            self.waiting_reason = problem
            self.upgrade.check()
            now = problem is None
            if now == state:
                return
            state = now
            self.recorder.mps_ready(self.resource_name, now, problem or "")
            if now:
                self.log.info("%s: MPS control daemon answers again; devices are Healthy", self.resource_name)
            else:
                self.log.warning("%s; its devices are Unhealthy until it returns", problem)
            on_change(now)

        def loop() -> None:
            guarded_loop(check, self._stop, self.log, f"{self.resource_name}: the MPS gate",
                         pause_s=self.probe_interval_s)

        self._watcher = guarded_thread(loop, f"mps gate {self.resource_name}", self.log,
                                       f"{self.resource_name}: the MPS gate")
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        self.recorder.mps_gone(self.resource_name)
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None


def _last_seen(status: DaemonStatus) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(status.updated))
    verb = "stopped" if status.state == "stopped" else "last reported"
    return f"the MPS daemon {verb} at {when}"
