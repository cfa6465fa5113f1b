"""The part of /sys the plugins read for a node profile: each GPU's PCI device with its NUMA node.

The stand-in node's sysfs (`NVDP_SYSFS_ROOT`): the inventory reads `bus/pci/devices/<address>/numa_node`
(the device plugin's topology for the kubelet, the DRA plugin's `resource.kubernetes.io/numaNode`) and
the PCIe root from where that link points. A GPU with a `pcie_root` is placed as in a real sysfs, under
`devices/<root>/<bridge>/<address>` with `bus/pci/devices/<address>` a relative link to it; without one
it is a plain directory there. `numa_node` is -1 where the profile has none, as the kernel writes it.

Run as a script, `python sysfs.py PROFILE.json ROOT`, it needs nothing but the standard library (images
are built with it where nvdp is not installed).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def write_sysfs_tree(gpus: Iterable[Mapping[str, Any]], root: Path) -> Path:
    """`gpus`: the profile's GPU entries (`pci_bus_id`, optional `numa_node` and `pcie_root`)."""
    links = root / "bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    for gpu in gpus:
        domain, _, rest = str(gpu["pci_bus_id"]).partition(":")
        address = f"{domain[-4:]}:{rest}".lower()
        pcie_root, numa = gpu.get("pcie_root"), gpu.get("numa_node")
        link = links / address
        if link.is_symlink():
            link.unlink()
        elif link.is_dir() and pcie_root is not None:
            shutil.rmtree(link)
        device = link
        if pcie_root is not None:
            bridge = f"{str(pcie_root).removeprefix('pci')}:01.0"  # the root port the GPU hangs off
            device = root / "devices" / str(pcie_root) / bridge / address
            device.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path("../../..") / "devices" / str(pcie_root) / bridge / address)
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(f"{-1 if numa is None else int(numa)}\n")
    return root


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: sysfs.py PROFILE.json ROOT", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        profile = json.load(f)
    write_sysfs_tree(profile.get("gpus") or [], Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
