"""GPU health: a thread that waits for NVML events and turns critical XIDs into unhealthy device UUIDs.

Which XIDs count is `xid_policy`'s; decoding NVML's event structure is `nvml_event`'s. Devices marked
unhealthy stay unhealthy until the plugin re-plans (SIGHUP) or restarts, as in NVIDIA's plugin: NVML
does not report that a GPU recovered, and a GPU that raised a critical XID usually needs a reset that
restarts the plugin anyway.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from nvdp.inventory.model import Gpu, Inventory
from nvdp.plugin.guard import guarded_loop, guarded_thread
from nvdp.plugin.nvml_event import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    event_fields,
    handle_address,
)
from nvdp.plugin.xid_policy import XidPolicy
from nvdp.recording import Recorder

XID_FALLEN_OFF_BUS = 79
WANTED_EVENTS = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC

OnUnhealthy = Callable[[frozenset[str], str], None]


def event_targets(inventory: Inventory, gpu_uuid: str, gi_id: int, ci_id: int) -> frozenset[str]:
    """The UUIDs an event on `gpu_uuid` makes unhealthy: the GPU, or just one of its MIG devices.

    A MIG event names its GPU and compute instance; when that instance is not in the inventory
    (created after start-up) nothing the plugin advertises is affected, so the result is empty.
    """
    if gi_id == NO_INSTANCE or ci_id == NO_INSTANCE:
        return frozenset({gpu_uuid})
    gpu = inventory.gpu(gpu_uuid)
    if gpu is None:
        return frozenset({gpu_uuid})
    for mig in gpu.mig_devices:
        if mig.gi_id == gi_id and mig.ci_id == ci_id:
            return frozenset({mig.uuid})
    return frozenset()


class HealthMonitor:
    """Waits for NVML XID/ECC events on every GPU and reports the affected UUIDs.

    `nvml` is the pynvml module (a stand-in object in tests). NVML must be initialised by the
    caller's process; the monitor takes its own nvmlInit/nvmlShutdown reference. `recorder` counts
    the XIDs and tells of the devices turned Unhealthy.
    """

    def __init__(
        self,
        inventory: Inventory,
        policy: XidPolicy,
        on_unhealthy: OnUnhealthy,
        log: logging.Logger,
        *,
        recorder: Recorder,
        nvml: Any = None,
        wait_ms: int = 1000,
    ) -> None:
        self._inventory = inventory
        self._policy = policy
        self._on_unhealthy = on_unhealthy
        self._log = log
        self._recorder = recorder
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._handles: dict[int, str] = {}  # handle address -> GPU UUID
        self._reported: set[str] = set()
        self._initialised = False
        self._close_lock = threading.Lock()
        self._beat = time.monotonic()  # the loop's last wake-up, for the liveness probe

    def start(self) -> bool:
        """Register for events and start the thread; False when health checks are off or impossible."""
        for word in self._policy.malformed:
            self._log.warning("Ignoring malformed XID value %r: use 'all', 'xids' or XID numbers", word)
        if not self._policy.enabled:
            self._log.info("Health checks disabled by configuration; devices will always be reported healthy")
            return False
        if not self._inventory.gpus:
            return False
        self._log.info("Health checks: %s", self._policy.describe())
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._register()
        except Exception as err:  # NVML is a C library: any failure here must not stop the plugin
            self._log.error("Failed to start health checks: %s; continuing with health checks disabled", err)
            self._close()
            return False
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
        failed: set[str] = set()
        for gpu in self._inventory.gpus:
            reason = self._register_gpu(gpu)
            if reason:
                failed.add(gpu.uuid)
                self._log.warning("GPU %d (%s): %s; marking it unhealthy", gpu.index, gpu.uuid, reason)
        if failed:
            self._report(frozenset(failed), "health check registration failed")

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
            return
        except Exception as err:  # whatever the binding raises counts as a failed wait
            self._wait_failed(err)
            return
        self._handle_event(data)

    def _wait_failed(self, err: Exception) -> None:
        lost = self._lost_gpus()
        if lost:
            self._report(lost, f"GPU is lost ({err})")
        else:
            all_gpus = frozenset(g.uuid for g in self._inventory.gpus)
            self._report(all_gpus, f"error waiting for NVML events ({err})")
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
            return
        # Counted before the devices are marked: whoever sees a device Unhealthy (the kubelet, a
        # metrics scrape) finds its XID already counted.
        self._recorder.xid(gpu_uuid or "unknown", xid, "critical")
        if gpu_uuid is None:
            targets = frozenset(g.uuid for g in self._inventory.gpus)
            self._report(targets, f"XID {xid} on a GPU that could not be identified")
            return
        targets = event_targets(self._inventory, gpu_uuid, gi_id, ci_id)
        if not targets:
            self._log.warning(
                "XID %d on GPU %s instance %d/%d, which no resource advertises; ignoring it",
                xid, gpu_uuid, gi_id, ci_id,
            )
            return
        reason = "GPU has fallen off the bus" if xid == XID_FALLEN_OFF_BUS else "critical error"
        self._report(targets, f"XID {xid} ({reason})")

    def _event_gpu(self, address: int, data: Any) -> str | None:
        known = self._handles.get(address)
        if known is not None:
            return known
        try:
            uuid = self._nvml.nvmlDeviceGetUUID(data.device)
        except Exception:
            return None
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def _report(self, uuids: frozenset[str], reason: str) -> None:
        fresh = uuids - self._reported
        if not fresh:
            return
        self._reported |= fresh
        try:
            self._on_unhealthy(fresh, reason)
        except Exception:  # a failing consumer must not end health checking
            self._log.exception("Could not apply health event for %s", sorted(fresh))
        self._recorder.devices_unhealthy(fresh, reason)

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
