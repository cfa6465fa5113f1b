"""Labels added or corrected to match NVIDIA's gpu-feature-discovery v0.20.0 (internal/lm, internal/vgpu).

- `gpu.mode` comes from the PCI class of every GPU: `unknown` when they differ (nvml.go
  getModeForClasses) or one cannot be read;
- `vgpu.present` is written whenever the PCI configuration spaces can be read: true when an NVIDIA
  function carries the vendor-specific capability signed "VF", with the host's vGPU manager version
  and branch from its record 0 (vgpu.go, pciutil.go);
- `gpu.clique` = <cluster UUID>.<clique id> when the GPUs attached to an NVLink fabric agree on both
  (imex.go getFabricIDs);
- under `migStrategy: single`, the invalid-MIG set has an empty `gpu.sharing-strategy` (test_labels.py).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from nvdp.gfd.host import gpu_mode, vendor_capability, vgpu_host, vgpu_host_driver
from nvdp.gfd.labels import HostFacts, VgpuHost, clique_labels, gfd_labels, vgpu_labels
from nvdp.gfd.reconcile import label_changes, owns
from nvdp.inventory.model import Fabric, Inventory
from nvdp.inventory.profile import load_profile

PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"
N = "nvidia.com/"
THREE_D, VGA = "0x030200", "0x030000"


def node(profile: str) -> Inventory:
    return load_profile(PROFILES / f"{profile}.yaml")


def pci_device(root: Path, address: str, *, pci_class: str = THREE_D, config: bytes | None = None,
               vendor: str = "0x10de") -> None:  # fmt: skip
    device = root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")
    if config is not None:
        (device / "config").write_bytes(config)


# -- gpu.mode -------------------------------------------------------------------------------------


def sysfs_for(inventory: Inventory, root: Path, classes: list[str | None]) -> str:
    for gpu, pci_class in zip(inventory.gpus, classes, strict=True):
        if pci_class is not None:
            address = gpu.pci_bus_id.lower()[4:]  # 00000000:18:00.0 -> 0000:18:00.0
            pci_device(root, address, pci_class=pci_class)
    return str(root)


@pytest.mark.parametrize(("classes", "mode"), [
    ([THREE_D, THREE_D], "compute"),
    ([VGA, VGA], "graphics"),
    ([THREE_D, VGA], "unknown"),  # once "compute": only the first GPU was read
    ([VGA, THREE_D], "unknown"),
    ([THREE_D, None], "unknown"),  # a class that cannot be read
])  # fmt: skip
def test_gpu_mode_needs_every_gpu_in_one_class(tmp_path: Path, classes: list[str | None], mode: str) -> None:
    inventory = node("h100-mig-empty")  # two GPUs
    assert gpu_mode(inventory, sysfs_for(inventory, tmp_path, classes)) == mode


# -- vgpu.* ---------------------------------------------------------------------------------------


def config_space(capability: bytes | None) -> bytes:
    """A 256-byte PCI configuration space: a power-management capability at 0x60, then `capability`
    (vendor-specific) at 0x68 when given."""
    config = bytearray(256)
    config[0:2] = b"\xde\x10"
    if capability is None:
        return bytes(config)
    config[0x06] = 0x10  # status: has a capability list
    config[0x34] = 0x60
    config[0x60:0x62] = bytes([0x01, 0x68])  # power management, next at 0x68
    config[0x68 : 0x68 + len(capability)] = capability
    return bytes(config)


def vgpu_capability(version: bytes, branch: bytes, records: bytes = b"") -> bytes:
    body = b"VF" + records + b"\x00\x16" + version.ljust(10, b"\0") + branch.ljust(10, b"\0")
    return bytes([0x09, 0x00, 3 + len(body)]) + body


def test_vgpu_capability_gives_the_host_driver() -> None:
    capability = vendor_capability(config_space(vgpu_capability(b"460.16", b"r460_00")))
    assert capability is not None and capability[3:5] == b"VF" and len(capability) == 27
    assert vgpu_host_driver(capability) == ("460.16", "r460_00")
    # another record first (id 1, 4 bytes long): the driver record follows it
    chained = vendor_capability(config_space(vgpu_capability(b"550.54.16", b"r550_40", b"\x01\x04ab")))
    assert chained is not None and vgpu_host_driver(chained) == ("550.54.16", "r550_40")


def test_passthrough_gpu_is_not_a_vgpu() -> None:
    passthrough = bytes([0x09, 0x00, 0x14]) + bytes(17)  # a vendor capability without "VF"
    capability = vendor_capability(config_space(passthrough))
    assert capability is not None and capability[3:5] != b"VF"
    assert vendor_capability(config_space(None)) is None


def test_vgpu_host_from_sysfs(tmp_path: Path) -> None:
    guest = tmp_path / "guest"
    pci_device(guest, "0000:00:05.0", config=config_space(vgpu_capability(b"550.54.16", b"r550_40")))
    pci_device(guest, "0000:00:06.0", vendor="0x8086", pci_class="0x060000")  # no config needed
    assert vgpu_host(str(guest)) == VgpuHost(True, "550.54.16", "r550_40")

    metal = tmp_path / "metal"
    pci_device(metal, "0000:3b:00.0", config=config_space(None))
    pci_device(metal, "0000:3b:00.1", pci_class="0x040300", config=config_space(None))  # its audio
    assert vgpu_host(str(metal)) == VgpuHost(False)

    unprivileged = tmp_path / "unprivileged"  # sysfs shows only the first 64 bytes without CAP_SYS_ADMIN
    pci_device(unprivileged, "0000:3b:00.0", config=config_space(None)[:64])
    assert vgpu_host(str(unprivileged)) is None


def test_vgpu_labels() -> None:
    assert vgpu_labels(VgpuHost(False)) == {N + "vgpu.present": "false"}
    assert vgpu_labels(VgpuHost(True, "550.54.16", "r550_40")) == {
        N + "vgpu.present": "true",
        N + "vgpu.host-driver-version": "550.54.16",
        N + "vgpu.host-driver-branch": "r550_40",
    }
    assert vgpu_labels(None) == {}  # configuration unreadable: NVIDIA writes none either
    labels = gfd_labels(node("t4"), None, "none", HostFacts(vgpu=VgpuHost(False)))
    assert labels[N + "vgpu.present"] == "false"


# -- gpu.clique -----------------------------------------------------------------------------------

CLUSTER = "4f2c1e0a-7b3d-4c5e-9f60-1a2b3c4d5e6f"


def with_fabrics(inventory: Inventory, fabrics: list[Fabric | None]) -> Inventory:
    gpus = tuple(msgspec.structs.replace(g, fabric=f) for g, f in zip(inventory.gpus, fabrics, strict=True))
    return msgspec.structs.replace(inventory, gpus=gpus)


def test_gb200_clique() -> None:
    labels = gfd_labels(node("gb200-nvl-4"), None, "none")
    assert labels[N + "gpu.clique"] == f"{CLUSTER}.32766"
    assert N + "gpu.clique" not in gfd_labels(node("t4"), None, "none")


def test_clique_rules() -> None:
    four = node("gb200-nvl-4")
    a, b = Fabric(CLUSTER, 1), Fabric(CLUSTER, 2)
    other = Fabric("00000000-0000-0000-0000-000000000001", 1)
    assert clique_labels(with_fabrics(four, [a, a, None, a])) == {N + "gpu.clique": f"{CLUSTER}.1"}
    assert clique_labels(with_fabrics(four, [a, b, a, a])) == {}  # clique IDs differ
    assert clique_labels(with_fabrics(four, [a, other, a, a])) == {}  # cluster UUIDs differ
    assert clique_labels(with_fabrics(four, [None] * 4)) == {}


def test_new_keys_are_owned_so_stale_ones_go() -> None:
    for key in ("gpu.clique", "vgpu.present", "vgpu.host-driver-version", "vgpu.host-driver-branch"):
        assert owns(N + key)
    node_labels = {N + "gpu.clique": f"{CLUSTER}.1", N + "vgpu.present": "true", "team": "ml"}
    assert label_changes(node_labels, {N + "gpu.product": "x"}, None) == {
        N + "gpu.product": "x", N + "gpu.clique": None, N + "vgpu.present": None,
    }  # fmt: skip
