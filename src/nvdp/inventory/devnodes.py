"""The NVIDIA driver's device-node names and the kernel's MIG capability table, as plain data.

Pure: shared by Allocate (nvdp.plugin.allocate) and the CDI spec (nvdp.cdi), which must name the
same nodes; the files themselves are read by the callers.
"""

from __future__ import annotations

import re

# The control nodes every NVML-managed container may get, in NVIDIA's order; each is optional.
CONTROL_DEVICE_PATHS = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
IMEX_CHANNEL_DEV_DIR = "/dev/nvidia-caps-imex-channels"
MIG_CAP_DEV_DIR = "/dev/nvidia-caps"
MIG_MINORS_FILE = "/proc/driver/nvidia-caps/mig-minors"

_MIG_MINOR_LINE = re.compile(r"^(?P<cap>\S+)\s+(?P<minor>\d+)$")


def gpu_node(minor: int) -> str:
    """The device node of the GPU with this minor number (nvmlDeviceGetMinorNumber)."""
    return f"/dev/nvidia{minor}"


def mig_cap_node(minor: int) -> str:
    """The device node of a MIG capability (a GPU or compute instance's access file) by its minor."""
    return f"{MIG_CAP_DEV_DIR}/nvidia-cap{minor}"


def imex_channel_node(channel: int) -> str:
    return f"{IMEX_CHANNEL_DEV_DIR}/channel{channel}"


def parse_mig_minors(text: str) -> dict[str, int]:
    """Parse the kernel's MIG capability table: lines like `gpu0/gi1/access 12`, `gpu0/gi1/ci0/access 13`.

    Keys are the capability names as written (`config`, `monitor`, `gpu<minor>/gi<g>/access`,
    `gpu<minor>/gi<g>/ci<c>/access`); values are the minors of /dev/nvidia-caps/nvidia-cap<minor>.
    A line of another form raises ValueError naming it.
    """
    minors: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _MIG_MINOR_LINE.match(line)
        if match is None:
            raise ValueError(f"{MIG_MINORS_FILE} line {number}: expected '<capability> <minor>', got {raw!r}")
        minors[match["cap"]] = int(match["minor"])
    return minors


def mig_cap_keys(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[str, str]:
    """The mig-minors entries one MIG device needs: its GPU instance and its compute instance."""
    gi = f"gpu{gpu_minor}/gi{gi_id}/access"
    return gi, f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"
