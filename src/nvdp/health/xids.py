"""What each critical XID needs before its GPU may serve again: a quiet period, or a GPU reset.

From NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), column
"Resolution Bucket (Immediate Action)", noted per XID below:
- RESTART_APP and IGNORE leave the GPU itself working (the driver has torn down the faulting
  context), so the GPU returns after a quiet period;
- RESET_GPU and RESTART_BM (and the "needs a GPU reset or node reboot" workflows of XIDs 48 and 74)
  need the GPU reset, so it returns only once NVML shows that the reset happened;
- XIDs whose action the driver states through NVML (the recovery-action field that XID 154
  announces, NVLink5 XIDs 144-150) wait for the quiet period, and the re-check holds the GPU down
  for as long as the driver asks for an action. Row remapping (XID 63) is the same: the re-check
  sees the pending remap.
An XID that is not listed is treated as needing a reset: a GPU kept down by mistake costs capacity,
one returned by mistake costs the next workload.
"""

from __future__ import annotations

import enum

from msgspec import Struct


class Remedy(enum.Enum):
    WAIT = "wait"  # the GPU is fine once no new XID arrives for the quiet period
    RESET = "reset"  # the GPU needs a reset; only NVML's evidence of one brings it back


class XidInfo(Struct, frozen=True):
    name: str
    remedy: Remedy


_W, _R = Remedy.WAIT, Remedy.RESET

CATALOGUE: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing", _W),  # RESTART_APP
    11: XidInfo("invalid or corrupted push buffer stream", _W),  # RESTART_APP
    13: XidInfo("graphics engine exception", _W),  # RESTART_APP
    31: XidInfo("GPU memory page fault", _W),  # RESTART_APP
    32: XidInfo("invalid or corrupted push buffer stream", _W),  # RESTART_APP
    38: XidInfo("driver firmware error", _W),  # IGNORE
    43: XidInfo("GPU stopped processing", _W),  # IGNORE
    45: XidInfo("preemptive cleanup, due to previous errors", _W),  # IGNORE, follow the other XID
    48: XidInfo("double-bit ECC error", _R),  # RESET_GPU (WORKFLOW_XID_48)
    56: XidInfo("display engine error", _R),  # CONTACT_SUPPORT
    57: XidInfo("error programming video memory interface", _R),  # CONTACT_SUPPORT
    61: XidInfo("internal micro-controller breakpoint/warning", _R),  # CONTACT_SUPPORT
    62: XidInfo("internal micro-controller halt", _R),  # RESET_GPU
    63: XidInfo("GPU memory remapping event", _W),  # IGNORE; the pending remap holds it down
    64: XidInfo("GPU memory remapping failure", _R),  # RESET_GPU
    68: XidInfo("NVDEC0 exception", _W),  # RESTART_APP
    69: XidInfo("graphics engine class error", _W),  # RESTART_APP
    74: XidInfo("NVLink error", _R),  # WORKFLOW_NVLINK_ERR: a GPU reset or node reboot clears it
    79: XidInfo("GPU has fallen off the bus", _R),  # RESTART_BM
    92: XidInfo("high single-bit ECC error rate", _W),  # IGNORE
    94: XidInfo("contained ECC error", _W),  # RESTART_APP
    95: XidInfo("uncontained ECC error", _R),  # RESET_GPU
    109: XidInfo("context switch timeout", _R),  # RESET_GPU
    110: XidInfo("security fault", _R),  # RESET_GPU
    119: XidInfo("GSP RPC timeout", _R),  # RESET_GPU
    120: XidInfo("GSP error", _R),  # RESET_GPU
    121: XidInfo("C2C link corrected error", _W),  # IGNORE
    136: XidInfo("link training failed", _R),  # RESET_GPU
    140: XidInfo("unrecovered ECC error", _R),  # RESET_GPU
    143: XidInfo("GPU initialization error", _R),  # RESET_GPU
    **{xid: XidInfo("NVLink5 error", _W) for xid in range(144, 151)},  # WORKFLOW_NVLINK5_ERR / XID 154
    154: XidInfo("GPU recovery action changed", _W),  # the re-check reads the action itself
    155: XidInfo("NVLink software-defined error", _R),  # RESET_GPU
}


def xid_info(xid: int) -> XidInfo:
    return CATALOGUE.get(xid, XidInfo("not in the XID catalogue", Remedy.RESET))


def describe(xid: int) -> str:
    """`XID 94 (contained ECC error)`."""
    return f"XID {xid} ({xid_info(xid).name})"
