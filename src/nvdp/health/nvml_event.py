"""NVML's event structure (nvmlEventData_t) decoded from pynvml's ctypes object, and NVML handles as keys.

Written out here so that importing it does not load pynvml: the event type bits are nvml.h's.
"""

from __future__ import annotations

import ctypes
import struct
from functools import cache
from typing import Any

# NVML's "no GPU/compute instance": the event belongs to the whole GPU, not one MIG device.
NO_INSTANCE = 0xFFFFFFFF

# nvmlEventType* bits (nvml.h).
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8

# nvmlEventData_t (nvml.h) in native layout: device handle, eventType, eventData, gpuInstanceId,
# computeInstanceId.
_EVENT_CODES = "PQQII"
_EVENT_NAMES = ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId")
_EVENT_DATA = struct.Struct("@" + _EVENT_CODES)


def event_fields(data: Any) -> tuple[int, int, int, int, int]:
    """An NVML event as (device handle address, type, data, GPU instance, compute instance).

    pynvml's event is a ctypes structure, read here with one unpack: each ctypes field read builds a
    Python object, and with caches cold (an event after a quiet second) five reads and a cast took
    about 50 us of the 1.3 ms from the XID to the kubelet, the unpack about 5. Anything else (a
    binding with another layout, tests' stand-ins) is read field by field.
    """
    if _native_event_layout(data.__class__):
        device, event_type, event_data, gi_id, ci_id = _EVENT_DATA.unpack_from(data)
        return device, event_type, event_data, gi_id, ci_id
    return (handle_address(data.device), int(data.eventType), int(data.eventData), int(data.gpuInstanceId),
            int(data.computeInstanceId))


@cache
def _native_event_layout(cls: type) -> bool:
    """Whether `cls` is a ctypes structure laid out as _EVENT_DATA: same fields, offsets and sizes."""
    if not issubclass(cls, ctypes.Structure):
        return False
    fields = getattr(cls, "_fields_", ())
    if tuple(f[0] for f in fields) != _EVENT_NAMES or ctypes.sizeof(cls) != _EVENT_DATA.size:
        return False
    for n, (name, code) in enumerate(zip(_EVENT_NAMES, _EVENT_CODES, strict=True)):
        field = getattr(cls, name)
        # "0<code>" pads to the field's alignment without adding it: its offset in a C struct.
        offset = struct.calcsize(f"@{_EVENT_CODES[:n]}0{code}")
        if field.offset != offset or field.size != struct.calcsize(code):
            return False
    return True


def handle_address(handle: Any) -> int:
    """A stable key for an NVML device handle (a ctypes pointer, or any object in tests)."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
