"""Test doubles shared by the lifecycle tests: a tiny inventory and a scripted NVML."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvdp.inventory.model import Gpu, Inventory, MigDevice


def gpu(index: int, mig: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index}",
        name="Tesla T4",
        memory_bytes=16 << 30,
        compute_capability=(7, 5),
        minor=index,
        pci_bus_id=f"0000:0{index}:00.0",
        mig_enabled=bool(mig),
        mig_devices=mig,
    )


def mig_device(parent: int, index: int, gi_id: int, ci_id: int) -> MigDevice:
    return MigDevice(
        uuid=f"MIG-{parent}-{index}",
        index=index,
        parent_uuid=f"GPU-{parent}",
        parent_index=parent,
        profile="1g.10gb",
        gi_id=gi_id,
        ci_id=ci_id,
        memory_bytes=10 << 30,
    )


def inventory(*gpus: Gpu) -> Inventory:
    return Inventory(driver_version="550.54.15", cuda_driver_version="12.4", gpus=tuple(gpus))


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Event:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class Handle:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid


class FakeNvml:
    """Just the pynvml calls the health monitor makes; events are fed through `events`, and the
    re-check readings are the sets and dicts below (a GPU in none of them reads as fine)."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_UNKNOWN = 999

    def __init__(self, uuids: list[str]) -> None:
        self.handles = {u: Handle(u) for u in uuids}
        self.events: queue.Queue[Event | NVMLError] = queue.Queue()
        self.registered: dict[str, int] = {}
        self.not_supported: set[str] = set()
        self.lost: set[str] = set()
        self.unanswering: set[str] = set()
        self.remap_pending: set[str] = set()
        self.retirement_pending: set[str] = set()
        self.volatile_ecc: dict[str, int] = {}
        self.recovery_action: dict[str, int] = {}
        self.no_recheck_readings = False  # an old driver: only the memory info answers
        self.init_count = 0
        self.waits = 0

    def nvmlInit(self) -> None:
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self.init_count -= 1

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        return self.handles[uuid]

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        if handle.uuid in self.lost:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return handle.uuid

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        if handle.uuid in self.not_supported:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return 0x8 | 0x2  # no single-bit ECC events on this board

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: object) -> None:
        self.registered[handle.uuid] = types

    def _gate(self, handle: Handle, reading: bool = True) -> None:
        if handle.uuid in self.lost:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        if handle.uuid in self.unanswering:
            raise NVMLError(self.NVML_ERROR_UNKNOWN)
        if reading and self.no_recheck_readings:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> object:
        self._gate(handle, reading=False)
        return object()

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        self._gate(handle)
        return int(handle.uuid in self.retirement_pending)

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        self._gate(handle)
        return (0, 0, int(handle.uuid in self.remap_pending), 0)

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        self._gate(handle)
        return self.volatile_ecc.get(handle.uuid, 0)

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[int]) -> list[Any]:
        self._gate(handle)
        value = type("Value", (), {"uiVal": self.recovery_action.get(handle.uuid, 0)})()
        return [type("Field", (), {"nvmlReturn": 0, "value": value})()]

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Event:
        self.waits += 1
        try:
            item = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(self.NVML_ERROR_TIMEOUT) from None
        if isinstance(item, NVMLError):
            raise item
        return item


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether `check()` becomes true within `timeout` seconds (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
