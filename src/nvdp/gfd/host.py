"""What GPU feature discovery reads from sysfs besides NVML: machine type, GPU mode, GPU presence.

The presence check reads only PCI vendor and class files, so it runs on any Linux node, with no
driver and no NVML library.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nvdp.gfd.labels import UNKNOWN, gpu_mode_from_pci_class
from nvdp.inventory.model import Inventory

log = logging.getLogger(__name__)

NVIDIA_PCI_VENDOR = "0x10de"
DISPLAY_CLASS_PREFIX = "0x03"  # PCI base class 03: display controllers (VGA, 3D); not NVSwitch or audio
PCI_DEVICES = "bus/pci/devices"


def machine_type(path: str) -> str:
    """The DMI product name (`/sys/class/dmi/id/product_name`), or "unknown" (NVIDIA's fallback)."""
    if not path:
        return UNKNOWN
    try:
        return Path(path).read_text(errors="replace").strip() or UNKNOWN
    except OSError as e:
        log.warning("cannot read the machine type from %s (%s); labelling it %s", path, e.strerror, UNKNOWN)
        return UNKNOWN


def sysfs_pci_address(bus_id: str) -> str:
    """NVML's bus id (00000000:3B:00.0) as sysfs names the device (0000:3b:00.0)."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def gpu_mode(inventory: Inventory, sysfs_root: str = "/sys") -> str:
    """compute / graphics / unknown from the PCI class of the first GPU, as NVIDIA reports it."""
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    if not gpus:
        return UNKNOWN
    path = Path(sysfs_root) / PCI_DEVICES / sysfs_pci_address(gpus[0].pci_bus_id) / "class"
    try:
        return gpu_mode_from_pci_class(path.read_text())
    except OSError:
        return UNKNOWN


def nvidia_gpus_present(sysfs_root: str = "/sys") -> list[str]:
    """PCI addresses of NVIDIA display controllers (vendor 0x10de, class 0x03xxxx) in sysfs."""
    found: list[str] = []
    devices = Path(sysfs_root) / PCI_DEVICES
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return found
    for device in entries:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            pci_class = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR and pci_class.startswith(DISPLAY_CLASS_PREFIX):
            found.append(device.name)
    return found
