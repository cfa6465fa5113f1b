"""What GPU feature discovery reads from sysfs besides NVML: machine type, GPU mode, vGPU, presence.

The presence check reads only PCI vendor and class files, so it runs on any Linux node, with no
driver and no NVML library. The vGPU check reads the PCI configuration space of every NVIDIA
function, as NVIDIA's does: a vGPU guest's GPU carries a vendor-specific capability signed "VF" with
the host's vGPU manager version in it. Reading the whole configuration space (256 bytes) needs a
privileged container; with less, NVIDIA writes no vGPU labels at all, and neither does this.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nvdp.gfd.labels import UNKNOWN, HostFacts, VgpuHost, gpu_mode_from_pci_class
from nvdp.health.state import Summary, read_usable_state, summary
from nvdp.inventory.model import Inventory

log = logging.getLogger(__name__)
_said: set[str] = set()  # warnings given once per process: they would repeat every pass


def _warn_once(message: str, *args: object) -> None:
    text = message % args
    log.log(logging.DEBUG if text in _said else logging.WARNING, "%s", text)
    _said.add(text)

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
    """compute / graphics from the PCI class all GPUs share; unknown when they differ or one cannot
    be read (NVIDIA's rule: a node of 3D controllers and VGA devices is neither)."""
    classes: set[str] = set()
    for gpu in inventory.gpus:
        path = Path(sysfs_root) / PCI_DEVICES / sysfs_pci_address(gpu.pci_bus_id) / "class"
        try:
            classes.add(path.read_text().strip().lower())
        except OSError:
            return UNKNOWN
    if len(classes) != 1:
        if len(classes) > 1:
            log.info("not all GPUs belong to the same PCI class (%s): gpu.mode is %s",
                     ", ".join(sorted(classes)), UNKNOWN)  # fmt: skip
        return UNKNOWN
    return gpu_mode_from_pci_class(classes.pop())


# PCI configuration space: status register, its capability-list bit, the first capability's offset,
# and the id of a vendor-specific capability.
_PCI_STATUS, _PCI_STATUS_CAP_LIST, _PCI_CAP_POINTER, _PCI_CAP_VENDOR = 0x06, 0x10, 0x34, 0x09
_PCI_CONFIG_SIZE = 256
_VGPU_SIGNATURE = b"VF"  # bytes 3-4 of the vendor-specific capability
_VGPU_RECORDS_AT = 5  # the capability's records: id, length, data; id 0 is the host driver's
_VGPU_FIELD = 10  # host driver version, then branch: 10 bytes each, NUL-padded


def vendor_capability(config: bytes) -> bytes | None:
    """The vendor-specific capability in a PCI configuration space, or None."""
    if len(config) < _PCI_CONFIG_SIZE or not config[_PCI_STATUS] & _PCI_STATUS_CAP_LIST:
        return None
    pos, seen = config[_PCI_CAP_POINTER], set()
    while pos and pos not in seen and pos + 2 < len(config) and config[pos] != 0xFF:
        seen.add(pos)
        if config[pos] == _PCI_CAP_VENDOR:
            return config[pos : pos + config[pos + 2]]
        pos = config[pos + 1]
    return None


def vgpu_host_driver(capability: bytes) -> tuple[str, str] | None:
    """(version, branch) of the host's vGPU manager from a "VF" capability, or None when absent."""
    pos = _VGPU_RECORDS_AT
    while pos < len(capability) and capability[pos] != 0:
        if pos + 1 >= len(capability) or capability[pos + 1] == 0:
            return None
        pos += capability[pos + 1]
    start = pos + 2
    if pos >= len(capability) or start + 2 * _VGPU_FIELD > len(capability):
        return None
    version = capability[start : start + _VGPU_FIELD]
    branch = capability[start + _VGPU_FIELD : start + 2 * _VGPU_FIELD]
    return version.strip(b"\0").decode(errors="replace"), branch.strip(b"\0").decode(errors="replace")


def vgpu_host(sysfs_root: str = "/sys") -> VgpuHost | None:
    """Whether an NVIDIA PCI function is a vGPU, and the host driver it reports; None when the
    configuration spaces cannot be read whole (an unprivileged container)."""
    present, driver = False, ("", "")
    try:
        entries = sorted((Path(sysfs_root) / PCI_DEVICES).iterdir())
    except OSError as e:
        _warn_once("cannot list PCI devices (%s): no vGPU labels", e.strerror)
        return None
    for device in entries:
        try:
            if (device / "vendor").read_text().strip().lower() != NVIDIA_PCI_VENDOR:
                continue
            config = (device / "config").read_bytes()
        except OSError as e:
            _warn_once("cannot read the PCI configuration of %s (%s): no vGPU labels", device.name,
                       e.strerror)  # fmt: skip
            return None
        if len(config) < _PCI_CONFIG_SIZE:
            _warn_once("only %d bytes of the PCI configuration of %s are readable (run privileged to read "
                       "all 256): no vGPU labels", len(config), device.name)  # fmt: skip
            return None
        capability = vendor_capability(config)
        if capability is not None and capability[3:5] == _VGPU_SIGNATURE:
            present = True
            driver = vgpu_host_driver(capability) or driver
    return VgpuHost(present, *driver)


def read_host_facts(inventory: Inventory, machine_type_file: str, sysfs_root: str = "/sys",
                    health_state_dir: str = "") -> HostFacts:
    return HostFacts(machine_type(machine_type_file), gpu_mode(inventory, sysfs_root), vgpu_host(sysfs_root),
                     health_summary(health_state_dir))


def health_summary(directory: str) -> Summary | None:
    """The plugin's health record in `directory` counted up; None without a directory or record."""
    record = read_usable_state(directory, log, "no health labels")
    return None if record is None else summary(record)


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
