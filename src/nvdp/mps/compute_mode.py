"""GPU compute modes through NVML: MPS wants EXCLUSIVE_PROCESS so only its server opens the GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Protocol

import pynvml

from nvdp.inventory.nvml import load_library

MODE_NAMES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
}


class ComputeModeError(RuntimeError):
    """NVML refused to read or change a GPU's compute mode."""


class ComputeModes(Protocol):
    def set_exclusive(self, uuids: Iterable[str]) -> None: ...

    def restore(self, uuids: Iterable[str]) -> None: ...

    def close(self) -> None: ...


class NvmlComputeModes:
    """Sets modes with nvmlDeviceSetComputeMode; NVML stays initialised while this object is used."""

    def __init__(self, container_driver_root: str = "/driver-root") -> None:
        # The same libnvidia-ml the inventory used (the driver root's copy when the runtime mounts one).
        load_library(container_driver_root)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise ComputeModeError(
                f"cannot initialise NVML to set GPU compute modes: {err}; run the MPS daemon with the "
                "NVIDIA container runtime (NVIDIA_DRIVER_CAPABILITIES must include utility)"
            ) from None

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def _set(self, uuids: Iterable[str], mode: int) -> None:
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                pynvml.nvmlDeviceSetComputeMode(handle, mode)
            except pynvml.NVMLError as err:
                raise ComputeModeError(
                    f"cannot set the compute mode of {uuid} to {MODE_NAMES[mode]}: {err}; the MPS daemon "
                    "container must run privileged (the chart does) and no other process may hold the GPU"
                ) from None

    def set_exclusive(self, uuids: Iterable[str]) -> None:
        self._set(uuids, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)

    def restore(self, uuids: Iterable[str]) -> None:
        # DEFAULT, as NVIDIA's daemon leaves it: the node's pre-MPS mode is not recorded anywhere durable.
        self._set(uuids, pynvml.NVML_COMPUTEMODE_DEFAULT)
