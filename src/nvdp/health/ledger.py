"""The health rules: which GPUs are down, and when each may serve again.

A GPU goes down on a critical XID, on falling off the bus, or when NVML stops answering for it. From
then on it is re-checked through NVML (`Check`), and it comes back only when all of these hold:
- no critical XID arrived for the quiet period (`Settings.after`); every new one starts it again;
- the re-check finds nothing wrong: the GPU answers, is not lost, has no page retirement or row
  remapping pending, no failed remap, and the driver asks for no recovery action;
- when the fault needs a reset (an XID of that kind in `nvdp.health.xids`, or a re-check that found
  the GPU broken), NVML has shown the reset: a re-check found it broken and a later one clean, or its
  volatile uncorrected-ECC count went down (a reset zeroes it). Time alone never brings it back.
A GPU that goes down more than `Settings.flap_limit` times within an hour stays down until it is
cleared by hand (`clear`), and with `Settings.after` None (`never`) nothing comes back by itself.

Times are wall-clock seconds, so that the record survives a restart (`nvdp.health.state`). The class
holds the faults and is safe to use from several threads; every decision is made from the arguments
and the record, never from the clock itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from msgspec import Struct, convert, to_builtins
from msgspec.structs import replace

from nvdp.health.xids import Remedy
from nvdp.text import short_list

HOUR_S = 3600.0
_KEEP_XIDS = 8  # the latest XIDs of a fault, for its messages

# NVML_GPU_RECOVERY_ACTION_* (nvml.h): what the driver says a GPU needs; 0 is none.
RECOVERY_ACTIONS = {1: "a GPU reset", 2: "a node reboot", 3: "a peer-to-peer drain",
                    4: "a drain and GPU reset", 5: "IMEX domain recovery", 6: "a bus reset",
                    7: "a system reboot"}  # fmt: skip

State = Literal["recovering", "needs-reset", "flapping", "recovery-off"]
ChangeKind = Literal["down", "held", "blocked", "recovered", "cleared"]


class Settings(Struct, frozen=True):
    after: float | None = 300.0  # quiet period in seconds; None: never recover
    flap_limit: int = 3  # more downs than this within `window_s`: stays down
    window_s: float = HOUR_S


class Cause(Struct, frozen=True):
    """Why devices go down now."""

    reason: str  # "XID 94 (contained ECC error)", "GPU is lost (...)"
    remedy: Remedy
    xid: int | None = None


class Check(Struct, frozen=True):
    """One NVML re-check of a GPU. Readings the driver does not support are left at their defaults."""

    answers: bool = True  # the handle by UUID and the memory info could be read
    lost: bool = False  # NVML_ERROR_GPU_IS_LOST
    error: str = ""  # why it did not answer
    retirement_pending: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    volatile_ecc: int | None = None  # uncorrected ECC errors since the last reset
    recovery_action: int = 0  # NVML_GPU_RECOVERY_ACTION_*

    def problems(self) -> tuple[str, ...]:
        """What keeps the GPU down, in words; empty when NVML finds it fine."""
        if self.lost:
            return ("the GPU is lost (fallen off the bus)",)
        if not self.answers:
            return (f"NVML does not answer for it ({self.error or 'no reason given'})",)
        found = []
        if self.retirement_pending:
            found.append("a page retirement is pending (applied at the next GPU reset)")
        if self.remap_pending:
            found.append("a row remapping is pending (applied at the next GPU reset)")
        if self.remap_failed:
            found.append("a row remapping failed (the GPU needs service)")
        if self.recovery_action:
            action = RECOVERY_ACTIONS.get(self.recovery_action, f"recovery action {self.recovery_action}")
            found.append(f"the driver asks for {action}")
        return tuple(found)


class Fault(Struct, frozen=True):
    """One GPU that is down: its devices, what took it down, what it waits for."""

    gpu: str
    devices: frozenset[str]  # the UUIDs that are Unhealthy: the GPU's, or some of its MIG devices'
    reason: str  # the first cause
    since: float
    last_fault: float  # the latest XID (or the going down); the quiet period counts from here
    xids: tuple[int, ...] = ()
    needs_reset: bool = False
    baseline_ecc: int | None = None  # the volatile uncorrected-ECC count when it went down
    seen_broken: bool = False  # a re-check after the fault found it broken: a clean one now means a reset
    blocked: str = ""  # what the latest re-check found wrong
    flapping: bool = False


class Change(Struct, frozen=True):
    """What a step did to one GPU, for the log, the Events and the consumers' lists."""

    kind: ChangeKind
    gpu: str
    devices: frozenset[str]
    message: str  # the whole story, for the log and the Event
    reason: str  # the cause alone, for the lists' log lines: "XID 48 (double-bit ECC error)"


class Ledger:
    """The node's faults, and the times each GPU went down within the flap window."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._faults: dict[str, Fault] = {}
        # gpu -> (time, cause) of each time it went down within the window, for the flap limit
        self._downs: dict[str, tuple[tuple[float, str], ...]] = {}

    # --- reading -----------------------------------------------------------------------------

    @property
    def unhealthy(self) -> frozenset[str]:
        """Every UUID that is down (GPUs and MIG devices)."""
        with self._lock:
            return frozenset().union(*(f.devices for f in self._faults.values()))

    def is_down(self, gpu: str) -> bool:
        with self._lock:
            return gpu in self._faults

    def faults(self) -> dict[str, Fault]:
        with self._lock:
            return dict(self._faults)

    def state(self, fault: Fault) -> State:
        if fault.flapping:
            return "flapping"
        if self.settings.after is None:
            return "recovery-off"
        return "needs-reset" if fault.needs_reset else "recovering"

    def due(self, now: float) -> list[str]:
        """The GPUs to re-check now: past their quiet period, or waiting for a reset (whose re-checks
        also watch for the broken state a reset goes through)."""
        after = self.settings.after
        if after is None:
            return []
        with self._lock:
            return [gpu for gpu, f in self._faults.items()
                    if not f.flapping and (f.needs_reset or now - f.last_fault >= after)]

    def outlook(self, fault: Fault) -> str:
        """What brings `fault`'s GPU back, for its messages."""
        gpu, state = fault.gpu, self.state(fault)
        if state == "flapping":
            causes = [cause for _, cause in self._downs.get(gpu, ())]
            return (f"it went Unhealthy {len(causes)} times within the last hour ({'; '.join(causes)}), "
                    f"more than the limit of {self.settings.flap_limit}, so it stays down: find the cause, "
                    f"then run `nvdp health clear {gpu}` in the plugin's container (or reboot the node)")
        if state == "recovery-off":
            return ("health recovery is off (healthRecoveryAfter: never): it stays down until the plugin "
                    "restarts")
        quiet = _seconds(self.settings.after)
        if state == "needs-reset":
            return (f"it needs a GPU reset (`nvidia-smi -r -i {gpu}` once no process uses it) or a node "
                    f"reboot, and comes back once NVML shows the reset and no critical XID for {quiet}")
        return f"it comes back by itself after {quiet} without a critical XID, once NVML reports it fine"

    # --- steps -------------------------------------------------------------------------------

    def fault(self, gpu: str, devices: Iterable[str], cause: Cause, now: float) -> list[Change]:
        """`devices` of `gpu` go down (a new XID on a GPU already down starts its quiet period again).

        The first re-check after it went down is given through `baseline`, after the consumers heard."""
        devices = frozenset(devices)
        needs_reset = cause.remedy is Remedy.RESET
        xids = (cause.xid,) if cause.xid is not None else ()
        with self._lock:
            known = self._faults.get(gpu)
            if known is not None:
                merged = replace(known, devices=known.devices | devices, last_fault=now,
                                 xids=(known.xids + xids)[-_KEEP_XIDS:],
                                 needs_reset=known.needs_reset or needs_reset)
                self._faults[gpu] = merged
                fresh = merged.devices - known.devices
                if not fresh:
                    return []
                message = f"{_name(gpu, fresh)}: {cause.reason}; {self.outlook(merged)}"
                return [Change("down", gpu, fresh, message, cause.reason)]
            downs = (*(d for d in self._downs.get(gpu, ()) if now - d[0] < self.settings.window_s),
                     (now, cause.reason))
            self._downs[gpu] = downs
            fault = Fault(gpu, devices, cause.reason, since=now, last_fault=now, xids=xids,
                          needs_reset=needs_reset, flapping=len(downs) > self.settings.flap_limit)
            self._faults[gpu] = fault
            kind: ChangeKind = "held" if fault.flapping else "down"
            message = f"{_name(gpu, devices)}: {cause.reason}; {self.outlook(fault)}"
            return [Change(kind, gpu, devices, message, cause.reason)]

    def baseline(self, gpu: str, check: Check) -> list[Change]:
        """The re-check made as `gpu` went down: the ECC count a reset will zero, and any problem that
        already means a reset is needed (said in a "blocked" change)."""
        with self._lock:
            fault = self._faults.get(gpu)
            if fault is None or fault.baseline_ecc is not None or fault.seen_broken:
                return []
            problems = check.problems()
            fault = replace(fault, baseline_ecc=check.volatile_ecc)
            if problems:
                fault = _broken(fault, problems)
            self._faults[gpu] = fault
            if not problems or fault.flapping:
                return []
            return [self._blocked(fault)]

    def checked(self, gpu: str, check: Check, now: float) -> list[Change]:
        """Apply a re-check of `gpu`: it stays down (saying why when that changed), or comes back."""
        with self._lock:
            fault = self._faults.get(gpu)
            if fault is None or fault.flapping:
                return []
            problems = check.problems()
            if problems:
                held = self._faults[gpu] = _broken(fault, problems)
                return [] if held.blocked == fault.blocked else [self._blocked(held)]
            if fault.blocked:
                fault = self._faults[gpu] = replace(fault, blocked="")
            after = self.settings.after
            if after is None or now - fault.last_fault < after:
                return []
            reset = fault.seen_broken or (fault.baseline_ecc is not None and check.volatile_ecc is not None
                                          and check.volatile_ecc < fault.baseline_ecc)
            if fault.needs_reset and not reset:
                return []
            del self._faults[gpu]
            how = ("NVML shows it was reset and reports it fine" if fault.needs_reset
                   else "NVML reports it fine")
            return [Change("recovered", gpu, fault.devices,
                           f"{_name(gpu, fault.devices)} is healthy again: no critical XID for "
                           f"{_seconds(after)} and {how} (it went down on {fault.reason})",
                           f"recovered from {fault.reason}")]

    def clear(self, gpus: Iterable[str] | None, now: float) -> list[Change]:
        """Bring GPUs back by hand (None: all), forgetting their downs; NVML is not asked."""
        with self._lock:
            chosen = list(self._faults) if gpus is None else [g for g in gpus if g in self._faults]
            changes = []
            for gpu in chosen:
                fault = self._faults.pop(gpu)
                self._downs.pop(gpu, None)
                changes.append(Change("cleared", gpu, fault.devices,
                                      f"{_name(gpu, fault.devices)} was cleared by hand and serves again "
                                      f"(it went down on {fault.reason})", "cleared by hand"))
            return changes

    def _blocked(self, fault: Fault) -> Change:
        """A re-check keeps `fault`'s GPU down: what it found, and what brings the GPU back."""
        message = f"{fault.gpu} stays Unhealthy: {fault.blocked}; {self.outlook(fault)}"
        return Change("blocked", fault.gpu, fault.devices, message, fault.blocked)

    # --- the record on disk --------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The faults and downs as JSON-ready data (see nvdp.health.state)."""
        with self._lock:
            gpus = {gpu: {**to_builtins(f), "state": self.state(f), "devices": sorted(f.devices)}
                    for gpu, f in sorted(self._faults.items())}
            downs = {gpu: [list(d) for d in times] for gpu, times in sorted(self._downs.items()) if times}
        return {"gpus": gpus, "downs": downs}

    def restore(self, record: Mapping[str, Any], now: float) -> list[Fault]:
        """Take faults and downs back from `record()` output of an earlier run; returns the faults taken.

        With recovery off nothing is taken back, as NVIDIA's plugin forgets faults when it restarts."""
        if self.settings.after is None:
            return []
        taken = []
        with self._lock:
            for gpu, times in dict(record.get("downs") or {}).items():
                kept = tuple((float(t), str(c)) for t, c in times if now - float(t) < self.settings.window_s)
                if kept:
                    self._downs[str(gpu)] = kept
            for gpu, data in dict(record.get("gpus") or {}).items():
                fields = {k: v for k, v in dict(data).items() if k != "state"}
                fault = convert(fields, Fault, strict=False)
                self._faults[str(gpu)] = replace(fault, gpu=str(gpu))
                taken.append(self._faults[str(gpu)])
        return taken


def _broken(fault: Fault, problems: tuple[str, ...]) -> Fault:
    """`fault` after a re-check found `problems`: it needs a reset now, and a later clean re-check
    shows one."""
    return replace(fault, seen_broken=True, needs_reset=True, blocked="; ".join(problems))


def _name(gpu: str, devices: frozenset[str]) -> str:
    others = sorted(devices - {gpu})
    return gpu if not others else f"{short_list(others)} on {gpu}"


def _seconds(value: float | None) -> str:
    """A duration as it is written in the settings: 300 -> "5m", 90 -> "1m30s", 0.5 -> "0.5s"."""
    if value is None:
        return "ever"
    whole = int(value)
    if whole != value or whole < 60:
        return f"{value:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, seconds = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if n)
