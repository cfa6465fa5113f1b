"""Which MPS daemon pod of a node runs its daemons, and how a new one takes over without killing a client.

An MPS server serves its clients until it ends, and a new control daemon cannot adopt another process's
servers: replacing the daemon pod while a pod uses MPS kills that pod's CUDA work. So the chart surges the
MPS DaemonSets (value `mps.upgrade: whenIdle`, the default) and the pods of one node take turns:

- a pod starts its daemons only once it holds the node's *holder lock* (`<base>/holder.lock`, an flock:
  the kernel drops it when the holding process ends, killed or not, whatever its PID namespace);
- a pod that finds the lock held waits as the *successor*: it holds `<base>/successor.lock`, writes
  `<base>/upgrade-wait.json` (who waits, since when, for which users) whenever that changes, and is Ready
  only while nothing on the node uses MPS, so that the DaemonSet controller retires the old pod exactly
  then (nothing needs the right to delete pods);
- the old pod's final stop sees a successor waiting and leaves the host's MPS state in place (the tmpfs
  the successor's container already shares); the successor takes the lock the moment that process ends.

`<base>` is the MPS root for device-plugin mode and `<MPS root>/<driver>` for a DRA driver's daemons. The
holder of device-plugin mode writes `<base>/holder.json` (the resources it serves), which a successor
needs to tell which pods use MPS. Plain files and flocks: no NVML, no processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from msgspec import Struct

from nvdp.config.names import node_name
from nvdp.mps.status import read_record, replace_file

HOLDER_LOCK = "holder.lock"
SUCCESSOR_LOCK = "successor.lock"
WAIT_FILE = "upgrade-wait.json"
HOLDER_FILE = "holder.json"
# The readiness probe's file in the daemon's container (the chart's exec probe tests it; env MPS_READY_FILE).
READY_FILE_ENV = "MPS_READY_FILE"
WHY_SUFFIX = ".why"  # beside the readiness file: what the failing probe prints
POD_NAME_ENV = "POD_NAME"  # the chart's downward API: who waits, in the record, the log and the Event
MAX_BYTES = 64 * 1024


class Users(Struct, frozen=True):
    """What uses the node's MPS daemons now: pods (`namespace/name`) or claims, or why that is unknown."""

    names: tuple[str, ...] = ()
    unknown: str | None = None  # why the users cannot be told (the successor then waits)

    @property
    def idle(self) -> bool:
        return not self.names and self.unknown is None

    def describe(self) -> str:
        if self.unknown is not None:
            return f"cannot tell which pods use MPS: {self.unknown}"
        return ", ".join(self.names) if self.names else "nothing uses MPS"


class UpgradeWait(Struct, frozen=True):
    """A successor's record: which pod waits, since when (epoch seconds), and for which users."""

    pod: str
    since: float
    users: Users

    def message(self, node: str) -> str:
        """One line for a log, an Event and nvdp doctor."""
        waited = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        if self.users.idle:
            return (f"the new MPS daemon pod {self.pod} on node {node} takes over as soon as the old one is "
                    "retired (nothing uses MPS on the node)")
        return (f"the new MPS daemon pod {self.pod} on node {node} has waited since {waited} to take over "
                f"from the running one, which serves MPS clients that an upgrade now would kill; it takes "
                f"over once they end ({self.users.describe()})")


class HolderRecord(Struct, frozen=True):
    """What the holder of device-plugin mode serves: the MPS resources' names."""

    pod: str
    resources: tuple[str, ...]


def read_wait(base: Path) -> UpgradeWait | None:
    return read_record(base / WAIT_FILE, UpgradeWait, MAX_BYTES)


def read_holder(base: Path) -> HolderRecord | None:
    return read_record(base / HOLDER_FILE, HolderRecord, MAX_BYTES)


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding `path`'s exclusive flock, or None when another process holds it.
    OSError when the file cannot be made or opened (an unusable root, reported elsewhere)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


def _held_elsewhere(path: Path) -> bool:
    """Whether another process holds `path`'s flock now (False when the file is missing or unusable)."""
    if not path.exists():
        return False
    try:
        fd = _try_lock(path)
    except OSError:
        return False
    if fd is None:
        return True
    os.close(fd)
    return False


def live_wait(base: Path) -> UpgradeWait | None:
    """The successor's record while its pod waits (a record left by a killed one is not)."""
    return read_wait(base) if _held_elsewhere(base / SUCCESSOR_LOCK) else None


class WaitReporter:
    """Tells a plugin's Node Events about a successor's wait at `base`, once per change of who waits for
    what (the plugins have the API rights; the MPS daemon pods have none)."""

    reason = "MPSUpgradeWaiting"  # declared in nvdp.daemon.report.event_reasons

    def __init__(self, base: Path, node: str, record: Callable[[str, str], None]) -> None:
        self.base = base
        self.node = node
        self.record = record  # (reason, message): a Recorder's Warning Event on the Node
        self._last: tuple[str, Users] | None = None

    def check(self) -> None:
        waiting = live_wait(self.base)
        now = None if waiting is None else (waiting.pod, waiting.users)
        if now != self._last and waiting is not None and not waiting.users.idle:
            self.record(self.reason, waiting.message(self.node))
        self._last = now


def holder_running(base: Path) -> bool:
    """Whether an MPS daemon pod holds `base` now (the init container then keeps the tmpfs it shares)."""
    return _held_elsewhere(base / HOLDER_LOCK)


class Handover:
    """This process's turn at `base`: holder, or successor waiting for an idle node.

    `users` says what uses MPS on the node now (asked only while waiting); `ready_file` is touched while
    this pod should count as Ready (None: no readiness file, outside the chart).
    """

    def __init__(self, base: Path, pod: str, users: Callable[[], Users], log: logging.Logger,
                 ready_file: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.base = base
        self.pod = pod or "<this pod>"
        self.users = users
        self.log = log
        self.ready_file = ready_file
        self.clock = clock
        self._holder_fd: int | None = None
        self._successor_fd: int | None = None
        self._wait: UpgradeWait | None = None
        self._ready(False)

    @classmethod
    def from_env(cls, base: Path, users: Callable[[], Users], log: logging.Logger,
                 env: os._Environ[str] | dict[str, str] = os.environ) -> Handover:
        ready = env.get(READY_FILE_ENV, "").strip()
        return cls(base, env.get(POD_NAME_ENV, "") or env.get("HOSTNAME", ""), users, log,
                   Path(ready) if ready else None)

    @property
    def holding(self) -> bool:
        return self._holder_fd is not None

    def take(self) -> bool:
        """Become the holder if nobody else is (True); else wait as the successor, recording for whom."""
        if self._holder_fd is not None:
            return True
        fd = _try_lock(self.base / HOLDER_LOCK)
        if fd is not None:
            self._holder_fd = fd
            if self._wait is not None:
                self.log.info("the previous MPS daemon pod is gone: taking over")
            self._end_wait()
            self._ready(True)
            return True
        self._wait_step()
        return False

    def successor_waiting(self) -> bool:
        """Whether another pod waits to take over (the final stop then leaves the host's state to it)."""
        return self.holding and _held_elsewhere(self.base / SUCCESSOR_LOCK)

    def record_resources(self, resources: tuple[str, ...]) -> None:
        """The holder's served resources, for a successor (device-plugin mode)."""
        try:
            replace_file(self.base / HOLDER_FILE,
                         msgspec.json.encode(HolderRecord(self.pod, tuple(sorted(resources)))) + b"\n")
        except OSError as err:
            self.log.warning("cannot write %s: %s; a new MPS daemon pod will wait for every pod that uses "
                             "a GPU until this one ends", self.base / HOLDER_FILE, err.strerror)

    def close(self, *, last: bool = False) -> None:
        """Give up the turn (the process is ending): successor record and locks released. `last`: the
        holder's final stop with nobody waiting, which cleans up the host (its files go too)."""
        if last and self.holding:
            for name in (HOLDER_FILE, SUCCESSOR_LOCK, HOLDER_LOCK):
                with contextlib.suppress(OSError):
                    (self.base / name).unlink(missing_ok=True)
        self._end_wait()
        for fd in (self._holder_fd, self._successor_fd):
            if fd is not None:
                os.close(fd)
        self._holder_fd = self._successor_fd = None
        self._ready(False)

    # --- inside ------------------------------------------------------------------------------------

    def _wait_step(self) -> None:
        if self._successor_fd is None:
            try:
                self._successor_fd = _try_lock(self.base / SUCCESSOR_LOCK)
            except OSError as err:
                self.log.warning("cannot hold %s: %s", self.base / SUCCESSOR_LOCK, err.strerror)
        users = self.users()
        before = self._wait
        if before is None or before.users != users:
            self._wait = UpgradeWait(self.pod, before.since if before else self.clock(), users)
            line = self._wait.message(node_name(os.environ) or "<this node>")
            (self.log.info if users.idle else self.log.warning)("%s", line)
            with contextlib.suppress(OSError):
                replace_file(self.base / WAIT_FILE, msgspec.json.encode(self._wait) + b"\n")
            self._why(line)
        self._ready(users.idle)

    def _end_wait(self) -> None:
        if self._wait is not None or self._successor_fd is not None:
            with contextlib.suppress(OSError):
                (self.base / WAIT_FILE).unlink(missing_ok=True)
        self._wait = None
        if self._successor_fd is not None:
            os.close(self._successor_fd)
            self._successor_fd = None

    def _why(self, line: str) -> None:
        """Beside the readiness file, what the readiness probe prints when it fails: the kubelet puts it
        in the waiting pod's `Unhealthy` Event, so `kubectl describe` shows it with no API right here."""
        if self.ready_file is not None:
            with contextlib.suppress(OSError):
                replace_file(Path(f"{self.ready_file}{WHY_SUFFIX}"), f"{line}\n".encode())

    def _ready(self, ready: bool) -> None:
        if self.ready_file is None:
            return
        with contextlib.suppress(OSError):
            if ready:
                self.ready_file.touch()
            else:
                self.ready_file.unlink(missing_ok=True)
