"""The processes running on each GPU and MIG device, with their memory and SM utilization, read through NVML.

For each GPU without MIG: its compute processes and MPS clients (`nvmlDeviceGetComputeRunningProcesses_v3`,
`nvmlDeviceGetMPSComputeRunningProcesses_v3`) with the memory each uses, and the SM utilization of each
over the last `window_s` seconds (`nvmlDeviceGetProcessUtilization`, the newest sample of each process;
none in the window: 0). For each MIG device the same without utilization, which NVML does not report
for MIG devices (nor for a GPU in MIG mode). The PIDs are those of the host's PID namespace when the
caller runs in it (the chart's usage metrics set hostPID).

The caller holds NVML initialized (nvdp.inventory.nvml.NvmlSession). A device NVML cannot read (lost,
not answering) is left out and named in `ProcessReading.unreadable`; the others are still read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pynvml
from msgspec import Struct

from nvdp.inventory.nvml import error_name, mig_device_handles

# How far back a utilization sample counts: about two of Prometheus' usual scrape intervals, so that a
# process busy in the last moments is not read as idle, and one that stopped a while ago is.
UTILIZATION_WINDOW_S = 20.0
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class ProcessUse(Struct, frozen=True):
    """One process on one device."""

    pid: int
    memory_bytes: int | None  # None: NVML does not know (NVML_VALUE_NOT_AVAILABLE)
    sm_util: int | None  # percent of the device's SMs; None where NVML has no per-process figure


class DeviceProcesses(Struct, frozen=True):
    """What runs on one GPU (MIG off) or MIG device."""

    uuid: str  # the GPU's or MIG device's UUID
    gpu_uuid: str  # its GPU
    processes: tuple[ProcessUse, ...]
    utilization: bool = True  # whether NVML gives per-process SM utilization here (not for MIG devices)


class ProcessReading(Struct, frozen=True):
    devices: tuple[DeviceProcesses, ...]
    unreadable: tuple[str, ...] = ()  # "GPU-... (ERROR_GPU_IS_LOST)", one per device NVML could not read


def read_processes(window_s: float = UTILIZATION_WINDOW_S,
                   clock: Callable[[], float] = time.time) -> ProcessReading:
    """Every GPU's and MIG device's processes; NVML must be initialized."""
    devices: list[DeviceProcesses] = []
    unreadable: list[str] = []
    since_us = max(0, int((clock() - window_s) * 1_000_000))
    for index in range(pynvml.nvmlDeviceGetCount()):
        what = f"GPU {index}"
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu_uuid = what = _text(pynvml.nvmlDeviceGetUUID(handle))
            if _mig_enabled(handle):
                devices.extend(_mig_devices(handle, gpu_uuid, unreadable))
            else:
                processes, utilization = _processes(handle, since_us)
                devices.append(DeviceProcesses(gpu_uuid, gpu_uuid, processes, utilization))
        except pynvml.NVMLError as e:
            unreadable.append(f"{what} ({error_name(e.value)})")
    return ProcessReading(tuple(devices), tuple(unreadable))


def _mig_devices(handle: Any, gpu_uuid: str, unreadable: list[str]) -> list[DeviceProcesses]:
    found: list[DeviceProcesses] = []
    for j, mig in mig_device_handles(handle):
        uuid = f"MIG device {j} of {gpu_uuid}"
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
            found.append(DeviceProcesses(uuid, gpu_uuid, _processes(mig, None)[0], utilization=False))
        except pynvml.NVMLError as e:
            unreadable.append(f"{uuid} ({error_name(e.value)})")
    return found


def _processes(handle: Any, since_us: int | None) -> tuple[tuple[ProcessUse, ...], bool]:
    """The device's compute processes and MPS clients, each once, and whether NVML gave their
    utilization (never asked when `since_us` is None: a MIG device)."""
    memory: dict[int, int | None] = {}
    for listing in (pynvml.nvmlDeviceGetComputeRunningProcesses_v3, _mps_clients):
        for info in listing(handle):
            memory.setdefault(int(info.pid), None if info.usedGpuMemory is None else int(info.usedGpuMemory))
    util = _utilization(handle, since_us) if since_us is not None else None
    return tuple(ProcessUse(pid, used, None if util is None else util.get(pid, 0))
                 for pid, used in sorted(memory.items())), util is not None


def _mps_clients(handle: Any) -> list[Any]:
    try:
        clients: list[Any] = pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(handle)
    except pynvml.NVMLError as e:
        if e.value in _ABSENT:
            return []
        raise
    return clients


def _utilization(handle: Any, since_us: int) -> dict[int, int] | None:
    """SM utilization by PID from the newest sample of each in the window; None: not supported."""
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
    except pynvml.NVMLError as e:
        if e.value == pynvml.NVML_ERROR_NOT_FOUND:
            return {}  # no process had a sample in the window
        if e.value in _ABSENT:
            return None
        raise
    newest: dict[int, tuple[int, int]] = {}
    for sample in samples:
        pid, stamp = int(sample.pid), int(sample.timeStamp)
        if pid not in newest or stamp > newest[pid][0]:
            newest[pid] = (stamp, int(sample.smUtil))
    return {pid: util for pid, (_, util) in newest.items()}


def _mig_enabled(handle: Any) -> bool:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as e:
        if e.value in _ABSENT:
            return False
        raise
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
