"""MIG devices end to end: GPUs read through pynvml from nvdp's stand-in NVML (8x H100 in mixed MIG
layouts, 28 MIG devices), fixture /proc files, a fake driver root; the spec against the design note's
rules (§1.3, §1.8): a MIG device gets its parent's /dev/nvidia<minor> and the nvidia-cap nodes of its GPU
and compute instances, with the minors the kernel's table gives (never computed); a cap node the host
has is stat'ed (NVIDIA's form), one it lacks is described from /proc (type c, the nvidia-caps major,
DeviceFileMode) for the runtime to create.

NVIDIA's mock NVML has no MIG devices, so this side has no NVIDIA golden file. Root only (mknod)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nvdp.cdi.build import build_specs
from nvdp.cdi.host import discover_host
from nvdp.cdi.spec import encode
from nvdp.config.model import Config, DeviceIdStrategy, Flags, MigStrategy, PluginFlags
from nvdp.inventory.model import Inventory
from nvdp.plan import plan
from sim.nvml import NodeSim
from tests.cdi.trees import char_device, needs_root, touch

pytestmark = [pytest.mark.slow, needs_root]

CAPS_MAJOR = 237
DISCOVER = """
import sys, msgspec
from nvdp.inventory.nvml import discover
sys.stdout.buffer.write(msgspec.json.encode(discover("/", "/nonexistent")))
"""


def kernel_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The minors the nvidia-caps module hands out (gpu0/gi0 is 3, 9 per GPU instance, 135 per GPU);
    used only to write the fixture, as the kernel would."""
    base = 3 + 135 * gpu_minor + 9 * gi
    return base if ci is None else base + 1 + ci


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    node = NodeSim("h100-mig-8", tmp_path_factory.mktemp("state"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVML_SIM_", "MOCK_NVML"))}
    env.update(node.env)
    result = subprocess.run([sys.executable, "-c", DISCOVER], env=env, capture_output=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr.decode()
    found = msgspec.json.decode(result.stdout, type=Inventory)
    assert sum(len(g.mig_devices) for g in found.gpus) == 28
    return found


def node_tree(tmp_path: Path, inventory: Inventory) -> tuple[Path, Path]:
    """The driver root (GPU nodes, cap nodes for GPU 0 only) and /proc (mig-minors for every GPU but
    GPU 2, whose minors are only in its capability files)."""
    root, proc = tmp_path / "root", tmp_path / "proc"
    version = inventory.driver_version
    touch(root / f"usr/lib/x86_64-linux-gnu/libcuda.so.{version}")
    touch(root / "usr/bin/nvidia-ctk", 0o755)
    char_device(root / "dev/nvidiactl", 195, 255)
    lines = ["config 1", "monitor 2"]
    for gpu in inventory.gpus:
        char_device(root / f"dev/nvidia{gpu.minor}", 195, gpu.minor)
        for mig in gpu.mig_devices:
            gi, ci = kernel_minor(gpu.minor, mig.gi_id), kernel_minor(gpu.minor, mig.gi_id, mig.ci_id)
            if gpu.minor == 0:
                char_device(root / f"dev/nvidia-caps/nvidia-cap{gi}", CAPS_MAJOR, gi, 0o444)
                char_device(root / f"dev/nvidia-caps/nvidia-cap{ci}", CAPS_MAJOR, ci, 0o444)
            if gpu.minor == 2:
                caps = proc / f"driver/nvidia/capabilities/gpu2/mig/gi{mig.gi_id}"
                for path, minor in ((caps / "access", gi), (caps / f"ci{mig.ci_id}/access", ci)):
                    touch(path, data=f"DeviceFileMinor: {minor}\nDeviceFileMode: 256\n".encode())
                continue
            lines += [f"gpu{gpu.minor}/gi{mig.gi_id}/access {gi}",
                      f"gpu{gpu.minor}/gi{mig.gi_id}/ci{mig.ci_id}/access {ci}"]
    touch(proc / "driver/nvidia-caps/mig-minors", data=("\n".join(lines) + "\n").encode())
    touch(proc / "devices", data=f"Character devices:\n195 nvidia\n{CAPS_MAJOR} nvidia-caps\n".encode())
    return root, proc


def spec_for(tmp_path: Path, inventory: Inventory, mig_strategy: MigStrategy,
             id_strategy: DeviceIdStrategy) -> dict[str, Any]:
    root, proc = node_tree(tmp_path, inventory)
    plugin = PluginFlags(device_list_strategy=("cdi-cri",), container_driver_root=str(root),
                         device_id_strategy=id_strategy)
    config = Config(flags=Flags(mig_strategy=mig_strategy, plugin=plugin))
    facts = discover_host(config, inventory, sysfs_root=str(tmp_path / "sys"), proc_root=str(proc),
                          environ={})
    (gpu,) = build_specs(config, inventory, plan(config, inventory), facts).specs
    document: dict[str, Any] = json.loads(encode(gpu))
    return document


def edits(document: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(d for d in document["devices"] if d["name"] == name)["containerEdits"]
    return found


def stat_form(path: str, major: int, minor: int, mode: int) -> dict[str, Any]:
    return {"path": path, "hostPath": path, "major": major, **({"minor": minor} if minor else {}),
            "fileMode": mode, "permissions": "rwm"}


def test_mig_devices_by_uuid(tmp_path: Path, inventory: Inventory) -> None:
    document = spec_for(tmp_path, inventory, "mixed", "uuid")
    names = [d["name"] for d in document["devices"]]
    migs = [m for g in inventory.gpus for m in g.mig_devices]
    assert names == sorted([m.uuid for m in migs] + ["all"])  # every GPU is in MIG mode: no GPU device
    # GPU 0, GI 7 / CI 0 (minors 66, 67): the host has the cap nodes, so they are stat'ed.
    assert edits(document, "MIG-97a0be89-cb0d-4ac8-8582-022c154ec604") == {"deviceNodes": [
        stat_form("/dev/nvidia0", 195, 0, 0o666),
        stat_form("/dev/nvidia-caps/nvidia-cap66", CAPS_MAJOR, 66, 0o444),
        stat_form("/dev/nvidia-caps/nvidia-cap67", CAPS_MAJOR, 67, 0o444),
    ]}
    # GPU 1's first MIG device: no host cap nodes, minors from mig-minors, described from /proc.
    first = inventory.gpus[1].mig_devices[0]
    gi, ci = kernel_minor(1, first.gi_id), kernel_minor(1, first.gi_id, first.ci_id)
    assert edits(document, first.uuid) == {"deviceNodes": [
        stat_form("/dev/nvidia1", 195, 1, 0o666),
        {"path": f"/dev/nvidia-caps/nvidia-cap{gi}", "type": "c", "major": CAPS_MAJOR, "minor": gi},
        {"path": f"/dev/nvidia-caps/nvidia-cap{ci}", "type": "c", "major": CAPS_MAJOR, "minor": ci},
    ]}
    # GPU 2: minors and modes from its capability files only.
    for mig in inventory.gpus[2].mig_devices:
        gi, ci = kernel_minor(2, mig.gi_id), kernel_minor(2, mig.gi_id, mig.ci_id)
        assert edits(document, mig.uuid)["deviceNodes"][1:] == [
            {"path": f"/dev/nvidia-caps/nvidia-cap{m}", "type": "c", "major": CAPS_MAJOR, "minor": m,
             "fileMode": 256} for m in (gi, ci)
        ]
    assert document["cdiVersion"] == "0.5.0"
    assert document["containerEdits"]["deviceNodes"] == [stat_form("/dev/nvidiactl", 195, 255, 0o666)]


def test_mig_devices_by_index_and_whole_gpus_under_mig_strategy_none(tmp_path: Path,
                                                                     inventory: Inventory) -> None:
    document = spec_for(tmp_path, inventory, "none", "index")
    names = {d["name"] for d in document["devices"]}
    # migStrategy none advertises each MIG GPU whole ("0".."7"); the MIG devices are described too.
    assert names == {str(g.index) for g in inventory.gpus} | {m.index_id for g in inventory.gpus
                                                               for m in g.mig_devices} | {"all"}
    assert edits(document, "3") == {"deviceNodes": [stat_form("/dev/nvidia3", 195, 3, 0o666)]}
    first = inventory.gpus[3].mig_devices[0]
    assert [n["path"] for n in edits(document, first.index_id)["deviceNodes"]] == [
        "/dev/nvidia3", f"/dev/nvidia-caps/nvidia-cap{kernel_minor(3, first.gi_id)}",
        f"/dev/nvidia-caps/nvidia-cap{kernel_minor(3, first.gi_id, first.ci_id)}"]
