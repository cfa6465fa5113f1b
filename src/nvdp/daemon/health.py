"""GPU health: a thread that waits for NVML events, takes GPUs down on critical XIDs and brings them back.

Which XIDs count is `xid_policy`'s; decoding NVML's event structure is `nvml_event`'s; when a GPU that
is down may serve again is `nvdp.health.ledger`'s. Between events (every `wait_ms`) the thread
re-checks the GPUs that are down through NVML (`nvdp.health.checks`), takes the hand-made clear
requests, and hands every change to its consumer (the plugin manager, the DRA plugin), the Recorder
(Events, metrics) and the record on disk (`nvdp.health.state`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msgspec.structs import replace

from nvdp.config.model import Config
from nvdp.daemon.guard import guarded_loop, guarded_thread
from nvdp.daemon.report.recording import Recorder
from nvdp.health.ledger import Cause, Change, Check, Ledger
from nvdp.health.nvml_event import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    event_fields,
    handle_address,
)
from nvdp.health.xid_policy import XidPolicy
from nvdp.health.xids import Remedy, describe, xid_info
from nvdp.inventory.model import Gpu, Inventory

WANTED_EVENTS = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC

# The consumer gets every UUID that is down now, and what changed.
OnHealth = Callable[[frozenset[str], Sequence[Change]], None]
# What the monitor saw that takes no GPU down: (GPU UUID, XID) for an XID outside the critical set,
# (GPU UUID, None) for a GPU whose events cannot be watched. The DRA plugin shows both as `None` taints.
OnNotice = Callable[[str, int | None], None]
RECHECK_EVERY_S = 1.0


def event_targets(inventory: Inventory, gpu_uuid: str, gi_id: int, ci_id: int, *,
                  made_on_demand: bool = False) -> frozenset[str]:
    """The UUIDs an event on `gpu_uuid` makes unhealthy: the GPU, or just one of its MIG devices.

    A MIG event names its GPU and compute instance; when that instance is not in the inventory
    (created after start-up) nothing the plugin advertises is affected, so the result is empty;
    except under migStrategy dynamic (`made_on_demand`), where the DRA plugin made it for a claim:
    its devices are the GPU's placements, so the GPU is marked, which takes them all down (the
    faulted MIG device with them; none is handed out again until the GPU is fine).
    """
    if gi_id == NO_INSTANCE or ci_id == NO_INSTANCE:
        return frozenset({gpu_uuid})
    gpu = inventory.gpu(gpu_uuid)
    if gpu is None:
        return frozenset({gpu_uuid})
    for mig in gpu.mig_devices:
        if mig.gi_id == gi_id and mig.ci_id == ci_id:
            return frozenset({mig.uuid})
    return frozenset({gpu_uuid}) if made_on_demand else frozenset()


def monitor_for(config: Config, inventory: Inventory, ledger: Ledger, on_health: OnHealth,
                log: logging.Logger, *, recorder: Recorder, writer: str,
                on_notice: OnNotice | None = None) -> HealthMonitor:
    """The monitor a daemon runs for `config`: its XID policy, and its record in healthStateDir."""
    from nvdp.health.xid_policy import policy_from_config

    return HealthMonitor(inventory, policy_from_config(config), ledger, on_health, log, recorder=recorder,
                         state_dir=config.flags.plugin.health_state_dir, writer=writer, on_notice=on_notice,
                         made_on_demand=config.flags.mig_strategy == "dynamic")


class HealthMonitor:
    """Waits for NVML XID/ECC events on every GPU, re-checks the GPUs that are down, reports changes.

    `nvml` is the pynvml module (a stand-in object in tests). NVML must be initialised by the
    caller's process; the monitor takes its own nvmlInit/nvmlShutdown reference. `ledger` outlives
    the monitor: a re-plan starts a new monitor on the same one, so a reload forgets no fault.
    `state_dir` (empty: none) is where the record is written and clear requests are taken.
    """

    def __init__(
        self,
        inventory: Inventory,
        policy: XidPolicy,
        ledger: Ledger,
        on_health: OnHealth,
        log: logging.Logger,
        *,
        recorder: Recorder,
        nvml: Any = None,
        wait_ms: int = 1000,
        state_dir: str = "",
        writer: str = "nvidia-device-plugin",
        clock: Callable[[], float] = time.time,
        on_notice: OnNotice | None = None,
        made_on_demand: bool = False,
    ) -> None:
        self._inventory = inventory
        self._made_on_demand = made_on_demand  # migStrategy dynamic: see event_targets
        self._policy = policy
        self.ledger = ledger
        self._on_health = on_health
        self._log = log
        self._recorder = recorder
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._state_dir = state_dir
        self._writer = writer
        self._clock = clock
        self._on_notice = on_notice
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._handles: dict[int, str] = {}  # handle address -> GPU UUID
        self._initialised = False
        self._close_lock = threading.Lock()
        self._beat = time.monotonic()  # the loop's last wake-up, for the liveness probe
        self._last_recheck = 0.0
        self._baseline_due: set[str] = set()  # GPUs gone down whose first re-check is still to come

    def start(self) -> bool:
        """Register for events and start the thread; False when health checks are off or impossible."""
        for word in self._policy.malformed:
            self._log.warning("Ignoring malformed XID value %r: use 'all', 'xids' or XID numbers", word)
        if not self._policy.enabled:
            self._log.info("Health checks disabled by configuration; devices will always be reported healthy")
            return False
        if not self._inventory.gpus:
            return False
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._register()
        except Exception as err:  # NVML is a C library: any failure here must not stop the plugin
            self._log.error("Failed to start health checks: %s; continuing with health checks disabled", err)
            self._close()
            return False
        # Said once the events are registered: an XID from here on is seen (tests wait for this line).
        after = self.ledger.settings.after
        self._log.info("Health checks: %s; %s", self._policy.describe(),
                       "recovery off (Unhealthy until restart)" if after is None
                       else f"GPUs come back after {after:g}s without a critical XID, once NVML reports "
                       "them fine")
        self._write_state()
        self._thread = guarded_thread(self._run, "health", self._log, "The health check thread")
        self._thread.start()
        return True

    def stalled(self, now: float, grace_s: float = 10.0) -> str | None:
        """Why the event loop looks stuck (None when it woke within its wait plus `grace_s`, or is off)."""
        thread = self._thread
        if thread is None or self._stop.is_set():
            return None
        if not thread.is_alive():
            return "the health check thread has ended"
        idle = now - self._beat
        if idle > self._wait_ms / 1000 + grace_s:
            return f"the health check loop has not woken for {idle:.0f}s (NVML event wait stuck?)"
        return None

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout if timeout is not None else self._wait_ms / 1000 + 2.0)
        self._thread = None
        if thread is None or not thread.is_alive():
            self._close()

    # --- NVML side -------------------------------------------------------------------------

    def _register(self) -> None:
        nvml = self._nvml
        nvml.nvmlInit()
        self._initialised = True
        self._event_set = nvml.nvmlEventSetCreate()
        failed: dict[str, frozenset[str]] = {}
        for gpu in self._inventory.gpus:
            reason = self._register_gpu(gpu)
            if reason:
                failed[gpu.uuid] = frozenset({gpu.uuid})
                self._log.warning("GPU %d (%s): %s; marking it unhealthy", gpu.index, gpu.uuid, reason)
        if failed:
            self._report(failed, Cause("health check registration failed", Remedy.RESET))

    def _register_gpu(self, gpu: Gpu) -> str:
        """Register one GPU's events; returns why that failed, or "" on success / too old."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            nvml.nvmlDeviceRegisterEvents(handle, WANTED_EVENTS & supported, self._event_set)
        except nvml.NVMLError as err:
            if _code(err) == nvml.NVML_ERROR_NOT_SUPPORTED:
                self._log.info("GPU %d (%s) is too old for health checks; skipping it", gpu.index, gpu.uuid)
                if self._on_notice is not None:
                    self._on_notice(gpu.uuid, None)
                return ""
            return f"cannot register for health events ({err})"
        self._handles[handle_address(handle)] = gpu.uuid
        return ""

    def _run(self) -> None:
        # An event that cannot be handled is logged with its traceback; checking goes on.
        guarded_loop(self._wait_once, self._stop, self._log, "Health checking", pause_s=self._wait_ms / 1000)
        self._close()

    def _wait_once(self) -> None:
        self._beat = time.monotonic()
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
        except nvml.NVMLError as err:
            if _code(err) != nvml.NVML_ERROR_TIMEOUT:
                self._wait_failed(err)
            self._recheck()
            return
        except Exception as err:  # whatever the binding raises counts as a failed wait
            self._wait_failed(err)
            return
        self._handle_event(data)
        self._recheck()

    def _wait_failed(self, err: Exception) -> None:
        lost = self._lost_gpus()
        if lost:
            cause = Cause(f"GPU is lost ({err})", Remedy.RESET)
            self._report({uuid: frozenset({uuid}) for uuid in lost}, cause)
        else:
            every = {g.uuid: frozenset({g.uuid}) for g in self._inventory.gpus}
            self._report(every, Cause(f"error waiting for NVML events ({err})", Remedy.WAIT))
        # A failing wait returns at once; without a pause the thread would spin.
        self._stop.wait(self._wait_ms / 1000)

    def _lost_gpus(self) -> frozenset[str]:
        nvml = self._nvml
        lost: set[str] = set()
        for gpu in self._inventory.gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                nvml.nvmlDeviceGetUUID(handle)
            except nvml.NVMLError as err:
                if _code(err) == nvml.NVML_ERROR_GPU_IS_LOST:
                    lost.add(gpu.uuid)
        return frozenset(lost)

    def _handle_event(self, data: Any) -> None:
        device, event_type, xid, gi_id, ci_id = event_fields(data)
        if not event_type & EVENT_XID_CRITICAL:
            self._log.debug("Skipping non-XID event type 0x%x", event_type)
            return
        gpu_uuid = self._event_gpu(device, data)
        if not self._policy.is_critical(xid):
            self._recorder.xid(gpu_uuid or "unknown", xid, "ignored")
            self._log.info("Ignoring XID %d (not critical under the current health check settings)", xid)
            if self._on_notice is not None and gpu_uuid:
                self._on_notice(gpu_uuid, xid)
            return
        # Counted before the devices are marked: whoever sees a device Unhealthy (the kubelet, a
        # metrics scrape) finds its XID already counted.
        self._recorder.xid(gpu_uuid or "unknown", xid, "critical")
        cause = Cause(describe(xid), xid_info(xid).remedy, xid)
        if gpu_uuid is None:
            every = {g.uuid: frozenset({g.uuid}) for g in self._inventory.gpus}
            unknown = f"{cause.reason} on a GPU that could not be identified"
            self._report(every, replace(cause, reason=unknown))
            return
        targets = event_targets(self._inventory, gpu_uuid, gi_id, ci_id, made_on_demand=self._made_on_demand)
        if not targets:
            self._log.warning(
                "XID %d on GPU %s instance %d/%d, which no resource advertises; ignoring it",
                xid, gpu_uuid, gi_id, ci_id,
            )
            return
        self._report({gpu_uuid: targets}, cause)

    def _event_gpu(self, address: int, data: Any) -> str | None:
        known = self._handles.get(address)
        if known is not None:
            return known
        try:
            uuid = self._nvml.nvmlDeviceGetUUID(data.device)
        except Exception:
            return None
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    # --- the ledger's side ---------------------------------------------------------------------

    def _report(self, targets: Mapping[str, frozenset[str]], cause: Cause) -> None:
        now = self._clock()
        changes: list[Change] = []
        for gpu, devices in targets.items():
            if self.ledger.is_down(gpu):
                self._log.info("%s on %s, which is already down: its quiet period starts again",
                               cause.reason, gpu)
            else:
                # What a reset will have to change is read at the next re-check (within a second),
                # off the path from the XID to the kubelet.
                self._baseline_due.add(gpu)
            changes += self.ledger.fault(gpu, devices, cause, now)
        self._publish(changes)

    def _recheck(self) -> None:
        """Take clear requests and re-check what is due, at most once per RECHECK_EVERY_S."""
        now = self._clock()
        if abs(now - self._last_recheck) < RECHECK_EVERY_S:
            return
        self._last_recheck = now
        changes: list[Change] = []
        wrote = bool(self._baseline_due)
        for gpu in sorted(self._baseline_due):
            check = self._check(gpu)
            if check is not None:
                changes += self.ledger.baseline(gpu, check)
        self._baseline_due.clear()
        if self._state_dir:
            from nvdp.health.state import take_clear_requests

            try:
                asked = take_clear_requests(self._state_dir)
            except OSError as err:
                self._log.warning("Cannot read health clear requests in %s: %s", self._state_dir, err)
            else:
                if asked is None or asked:
                    changes += self.ledger.clear(asked, now)
        for gpu in self.ledger.due(now):
            check = self._check(gpu) or Check(answers=False, error="the NVML re-check failed")
            changes += self.ledger.checked(gpu, check, now)
        self._publish(changes, write=wrote)

    def _check(self, gpu: str) -> Check | None:
        # Imported on the first re-check, as the record's module is on the first write: a plugin whose
        # GPUs stay healthy, without a record, loads neither (tests/footprint counts the modules).
        from nvdp.health.checks import check_gpu

        try:
            return check_gpu(self._nvml, gpu)
        except Exception as err:  # a re-check that cannot run must not end health checking
            self._log.warning("Cannot re-check GPU %s through NVML: %s", gpu, err)
            return None

    def _publish(self, changes: Sequence[Change], write: bool = False) -> None:
        """Tell the consumer, the log, the Recorder and the record on disk (also with no change when
        `write`: the ledger learnt something the record keeps)."""
        if not changes:
            if write:
                self._write_state()
            return
        # The gauges first: a scrape that sees the kubelet's new list sees the states behind it too.
        self._record_states()
        try:
            self._on_health(self.ledger.unhealthy, changes)
        except Exception:  # a failing consumer must not end health checking
            self._log.exception("Could not apply health changes for %s", sorted(c.gpu for c in changes))
        for change in changes:
            log = self._log.info if change.kind in ("recovered", "cleared") else self._log.warning
            log("%s", change.message)
            self._recorder.health_changed(change.kind, change.gpu, change.message)
        self._write_state(recorded=True)

    def _record_states(self) -> None:
        faults = self.ledger.faults()
        self._recorder.health_states({gpu: self.ledger.state(f) for gpu, f in faults.items()})

    def _write_state(self, recorded: bool = False) -> None:
        if not recorded:
            self._record_states()
        if not self._state_dir:
            return
        from nvdp.health.state import write_state

        try:
            write_state(self._state_dir, self._writer, self.ledger.record(), self._clock())
        except OSError as err:
            self._log.warning("Cannot write the health record in %s: %s; a restart will not remember "
                              "the GPUs that are down", self._state_dir, err)

    def _close(self) -> None:
        # Called from the thread's exit and from stop(); NVML's init count must drop only once.
        with self._close_lock:
            nvml, event_set, initialised = self._nvml, self._event_set, self._initialised
            self._event_set = None
            self._initialised = False
        if nvml is None or not initialised:
            return
        try:
            if event_set is not None:
                nvml.nvmlEventSetFree(event_set)
            nvml.nvmlShutdown()
        except Exception as err:
            self._log.debug("NVML clean-up after health checks: %s", err)


def _code(err: Exception) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None
