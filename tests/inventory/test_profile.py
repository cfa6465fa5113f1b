"""Node profile parsing: shipped profiles, derived topology, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvdp.inventory.model import TOPOLOGY_LEVELS, Inventory
from nvdp.inventory.profile import ProfileError, inventory_from_profile, load_profile
from sim.nvml import PROFILES_DIR, list_profiles

MIB = 1024 * 1024
LEVEL = {name: value for value, name in TOPOLOGY_LEVELS.items()}


def minimal(**gpu: Any) -> dict[str, Any]:
    base = {
        "index": 0,
        "uuid": "GPU-11111111-2222-3333-4444-555555555555",
        "name": "Tesla T4",
        "memory_mib": 15360,
        "compute_capability": "7.5",
        "minor": 0,
        "pci_bus_id": "00000000:3B:00.0",
    }
    base.update(gpu)
    return {"driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": [base]}


def test_every_shipped_profile_loads() -> None:
    assert list_profiles() == [
        "a100-80gb-mig-dynamic", "a100-sxm-8", "gb200-nvl-4", "h100-mig-8", "h100-mig-dynamic",
        "h100-mig-empty", "h100-mig-single", "mixed-4", "rtx-pro-6000-mig-me", "t4",
    ]  # fmt: skip
    for name in list_profiles():
        inventory = load_profile(PROFILES_DIR / f"{name}.yaml")
        n = len(inventory.gpus)
        assert len(inventory.links) == n * (n - 1) // 2, name


def test_t4_profile() -> None:
    inv = load_profile(PROFILES_DIR / "t4.yaml")
    assert (inv.driver_version, inv.cuda_driver_version) == ("550.54.15", "12.4")
    (gpu,) = inv.gpus
    assert (gpu.name, gpu.memory_bytes, gpu.compute_capability) == ("Tesla T4", 15360 * MIB, (7, 5))
    assert not gpu.mig_capable and gpu.mig_devices == ()


def test_a100_nvswitch_links_and_numa_split() -> None:
    inv = load_profile(PROFILES_DIR / "a100-sxm-8.yaml")
    assert [g.numa_node for g in inv.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {lk.nvlinks for lk in inv.links} == {12}
    assert inv.link(1, 0) is not None and inv.link(1, 0).pcie_level == LEVEL["multiple"]  # type: ignore[union-attr]
    assert inv.link(0, 2).pcie_level == LEVEL["node"]  # type: ignore[union-attr]
    assert inv.link(3, 4).pcie_level == LEVEL["system"]  # type: ignore[union-attr]
    assert all(g.mig_capable and not g.mig_enabled for g in inv.gpus)


def test_h100_mixed_mig_layouts() -> None:
    inv = load_profile(PROFILES_DIR / "h100-mig-8.yaml")
    profiles = {m.profile for g in inv.gpus for m in g.mig_devices}
    assert profiles == {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
    gpu1 = inv.gpus[1]
    assert [m.index_id for m in gpu1.mig_devices] == ["1:0", "1:1", "1:2", "1:3"]
    assert all(m.parent_uuid == gpu1.uuid for m in gpu1.mig_devices)
    single = load_profile(PROFILES_DIR / "h100-mig-single.yaml")
    assert {m.profile for g in single.gpus for m in g.mig_devices} == {"1g.10gb"}
    empty = load_profile(PROFILES_DIR / "h100-mig-empty.yaml")
    assert empty.gpus[0].mig_enabled and empty.gpus[0].mig_devices == ()
    assert not empty.gpus[1].mig_enabled


def test_mixed_profile_direct_nvlink_only_between_v100s() -> None:
    inv = load_profile(PROFILES_DIR / "mixed-4.yaml")
    assert [g.compute_capability for g in inv.gpus] == [(7, 5), (7, 5), (7, 0), (7, 0)]
    assert {(lk.a, lk.b): lk.nvlinks for lk in inv.links if lk.nvlinks} == {(2, 3): 2}


def test_json_profile_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(minimal(numa_node=None)))
    inv = load_profile(path)
    assert inv == Inventory(driver_version="550.54.15", cuda_driver_version="12.4", gpus=inv.gpus)
    assert inv.gpus[0].numa_node is None


def error(doc: Any) -> str:
    with pytest.raises(ProfileError) as err:
        inventory_from_profile(doc)
    return str(err.value)


def file_error(path: Path) -> str:
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    return str(err.value)


MIG_ON = {"mig_capable": True, "mig_enabled": True}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"memory_mib": "16GB"}, "gpus[0].memory_mib: required, expected a non-negative integer, got '16GB'"),
        ({"memory_mib": 0}, "gpus[0].memory_mib: must be greater than 0"),
        ({"uuid": "8f6b3f2e"}, "gpus[0].uuid: a GPU UUID starts with 'GPU-', got '8f6b3f2e'"),
        ({"index": 3}, "gpus[0].index: is 3, but GPUs must be listed in index order (expected 0)"),
        (
            {"compute_capability": 7.5},
            "gpus[0].compute_capability: required, expected a non-empty string, got 7.5",
        ),
        (
            {"pci_bus_id": "3b:00"},
            "gpus[0].pci_bus_id: expected a PCI address like '00000000:3B:00.0', got '3b:00'",
        ),
        ({"numa_node": -1}, "gpus[0].numa_node: expected a non-negative integer or null, got -1"),
        (
            {"mig_enabled": True},
            "gpus[0].mig_enabled: true needs mig_capable: true (this GPU cannot run MIG)",
        ),
        (
            {"memory": 1},
            "gpus[0]: unknown field 'memory' (known fields: addressing_mode, architecture, brand, "
            "compute_capability, compute_mode, fabric, index, memory_mib, mig_capable, mig_devices, "
            "mig_enabled, mig_pending, mig_profiles, minor, name, numa_node, pci_bus_id, pcie_root, uuid, "
            "xid_events)",
        ),
        (
            {"compute_mode": "EXCLUSIVE"},
            "gpus[0].compute_mode: expected one of DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS, got 'EXCLUSIVE'",
        ),
        (
            {"mig_devices": [{"uuid": "MIG-1"}]},
            "gpus[0].mig_devices: listed, but mig_enabled is not true",
        ),
        (
            {**MIG_ON, "mig_devices": [{"uuid": "MIG-1", "profile": "1g", "gi_id": 1}]},
            "gpus[0].mig_devices[0].profile: expected a MIG profile like '1g.10gb' or '1g.10gb+me', got '1g'",
        ),
        (
            {**MIG_ON, "mig_devices": [{"uuid": "MIG-1", "profile": "1g.10gb", "gi_id": 1, "memory_mib": 9}]},
            "gpus[0].mig_devices[0].ci_id: required, expected a non-negative integer, got nothing",
        ),
    ],
)
def test_gpu_field_errors(change: dict[str, Any], message: str) -> None:
    assert error(minimal(**change)) == message


def test_topology_errors() -> None:
    assert (
        error(dict(minimal(), nvlinks=[{"gpus": [0, 1], "links": 2}]))
        == "nvlinks[0].gpus: 1 is not a GPU index of this profile (0..0)"
    )
    assert error(dict(minimal(), pcie={"default": "numa"})) == (
        "pcie.default: expected one of internal, single, multiple, hostbridge, node, system, got 'numa'"
    )
    assert error(dict(minimal(), nvswitch={"links_per_gpu": 40})) == (
        "nvlinks: GPU 0 has 40 NVLink links; NVML reports at most 36"
    )


def test_duplicate_uuid_and_top_level_errors() -> None:
    doc = minimal()
    doc["gpus"].append(dict(doc["gpus"][0], index=1, minor=1))
    assert error(doc) == (
        "gpus[1]: UUID GPU-11111111-2222-3333-4444-555555555555 is used twice; every device needs its own"
    )
    assert error(dict(minimal(), cuda_driver_version="12")) == (
        'cuda_driver_version: expected "major.minor" like "12.4", got \'12\''
    )
    assert error({"driver_version": "1", "cuda_driver_version": "12.4"}) == (
        "gpus: expected a list of GPUs, got nothing"
    )
    assert error([]) == "the top level must be a mapping of fields, got list"


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert file_error(missing) == f"node profile {missing}: cannot read it: No such file or directory"
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus: [\n")
    assert file_error(broken).startswith(f"node profile {broken}: not valid YAML: ")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(minimal(minor="zero")))
    assert file_error(bad) == (
        f"node profile {bad}: gpus[0].minor: required, expected a non-negative integer, got 'zero'"
    )
