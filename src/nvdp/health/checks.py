"""The NVML re-check of one GPU: does it answer, is it lost, does it wait for a reset.

`nvml` is the pynvml module (a stand-in object in tests), initialised by the caller. A reading the
driver does not support (an older GPU, an older driver) is left out rather than counted as a problem.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from nvdp.health.ledger import Check

MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC = 0  # NVML_VOLATILE_ECC: since the last driver load or GPU reset
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

T = TypeVar("T")


def check_gpu(nvml: Any, uuid: str) -> Check:
    """Re-check `uuid` through NVML."""
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        nvml.nvmlDeviceGetMemoryInfo(handle)
        retirement = _read(nvml, lambda: int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)), 0)
        remap = _read(nvml, lambda: tuple(nvml.nvmlDeviceGetRemappedRows(handle)), (0, 0, 0, 0))
        ecc = _read(nvml, lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
            handle, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC)), None)
        action = _read(nvml, lambda: _recovery_action(nvml, handle), 0)
    except nvml.NVMLError as err:
        return Check(answers=False, lost=_code(err) == nvml.NVML_ERROR_GPU_IS_LOST, error=str(err))
    return Check(retirement_pending=bool(retirement), remap_pending=bool(remap[2]),
                 remap_failed=bool(remap[3]), volatile_ecc=ecc, recovery_action=action)


def _read(nvml: Any, read: Callable[[], T], unsupported: T) -> T:
    """One reading; `unsupported` when this GPU or driver does not have it (any other error is the
    GPU's and propagates)."""
    try:
        return read()
    except nvml.NVMLError as err:
        unsupported_codes = (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if _code(err) in unsupported_codes:
            return unsupported
        raise


def _recovery_action(nvml: Any, handle: Any) -> int:
    value = nvml.nvmlDeviceGetFieldValues(handle, [FIELD_RECOVERY_ACTION])[0]
    if int(getattr(value, "nvmlReturn", 0)) != 0:
        return 0  # this driver does not report it
    return int(value.value.uiVal)


def _code(err: Exception) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None
