"""A node's driver files for CDI: a fake driver root (versioned libcuda, real character device nodes made
with mknod), a stand-in hook in its own folder, and a CDI folder, all under one folder.

The plugins see the driver root as their container driver root (DRIVER_ROOT_CTR_PATH) and the hook's
folder as the chart's mount (NVDP_HOST_HOOK_DIR), and write their specs to NVDP_CDI_DIR (the device
plugin) or CDI_ROOT (the DRA plugin's claims). Device nodes must be character devices (nvdp.cdi.nodes
takes nothing else, as NVIDIA's toolkit), which needs mknod, so root. Used by the tests and the DRA demo;
never installed with nvdp.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvdp.inventory.model import Inventory

VENDOR = "k8s.device-plugin.nvidia.com"
GPU_KIND = f"{VENDOR}/gpu"
SPEC_NAME = f"{VENDOR}-gpu.json"
LIB_DIR = "usr/lib/x86_64-linux-gnu"
NVIDIA_MAJOR = 195
CTL_MINOR = 255
HOOK = "nvidia-ctk"


def mknod_problem(folder: Path) -> str | None:
    """Why character devices cannot be made in `folder`, or None."""
    probe = folder / ".mknod-probe"
    try:
        os.mknod(probe, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError as err:
        return (f"cannot make device nodes here ({err.strerror}): the CDI spec needs real /dev/nvidia* "
                "nodes; run as root")
    probe.unlink()
    return None


class NoDeviceNodes(RuntimeError):
    """Character devices cannot be made here; the message says why and the fix."""


@dataclass
class CdiNode:
    driver_root: Path
    hook_dir: Path
    cdi_dir: Path

    @property
    def env(self) -> dict[str, str]:
        """The plugin's environment for this node (the strategy is the caller's to add)."""
        return {
            "DRIVER_ROOT_CTR_PATH": str(self.driver_root),
            "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
            "NVDP_HOST_HOOK_DIR": str(self.hook_dir),
            "NVDP_CDI_DIR": str(self.cdi_dir),
        }

    @property
    def spec_path(self) -> Path:
        return self.cdi_dir / SPEC_NAME

    def spec(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.spec_path.read_text())
        return loaded

    def device_names(self) -> list[str]:
        return sorted(d["name"] for d in self.spec()["devices"])


def make_driver_root(folder: Path, inventory: Inventory) -> CdiNode:
    """The driver root, hook and CDI folder for `inventory`; NoDeviceNodes without mknod."""
    folder.mkdir(parents=True, exist_ok=True)
    problem = mknod_problem(folder)
    if problem is not None:
        raise NoDeviceNodes(problem)
    root = folder / "driver-root"
    lib = root / LIB_DIR
    lib.mkdir(parents=True)
    version = inventory.driver_version
    (lib / f"libcuda.so.{version}").write_bytes(b"not an ELF: enough for the spec's mounts\n")
    (lib / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    dev = root / "dev"
    dev.mkdir()
    nodes = {f"nvidia{gpu.minor}": gpu.minor for gpu in inventory.gpus} | {"nvidiactl": CTL_MINOR}
    for name, minor in nodes.items():
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
        os.chmod(dev / name, 0o666)
    hook_dir = folder / "hook"
    hook_dir.mkdir()
    hook = hook_dir / HOOK
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    return CdiNode(root, hook_dir, folder / "cdi")
