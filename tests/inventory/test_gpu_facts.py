"""Brand, architecture, PCIe root, addressing mode and GPU instance facts: from profiles, and through the
stand-in NVML."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from nvdp.inventory import nvml
from nvdp.inventory.facts import (
    architecture_from_cc,
    default_gi_profile_id,
    mig_memory_slices,
    pack_placements,
)
from nvdp.inventory.profile import ProfileError, inventory_from_profile, load_profile
from sim.nvml import PROFILES_DIR, NodeSim

from .test_discovery import DISCOVER, parse

RunPy = Callable[..., subprocess.CompletedProcess[str]]
H100_MIB = 81559
A100_MIB = 40960


def mig_profile(migs: list[dict[str, Any]], memory_mib: int = H100_MIB, **gpu: Any) -> dict[str, Any]:
    devices = [
        {"uuid": f"MIG-{j}", "gi_id": j + 1, "ci_id": 0, "memory_mib": 1000, **m} for j, m in enumerate(migs)
    ]
    base = {"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3", "memory_mib": memory_mib,
            "compute_capability": "9.0", "minor": 0, "pci_bus_id": "00000000:18:00.0", "mig_capable": True,
            "mig_enabled": True, "mig_devices": devices, **gpu}  # fmt: skip
    return {"driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": [base]}


def facts(doc: dict[str, Any]) -> list[tuple[int | None, int | None, int | None]]:
    gpu = inventory_from_profile(doc).gpus[0]
    return [(m.gi_profile_id, m.placement_start, m.placement_size) for m in gpu.mig_devices]


@pytest.mark.parametrize(
    ("profile", "memory_mib", "gi_profile_id", "slices"),
    [("1g.10gb", H100_MIB, 19, 1), ("1g.20gb", H100_MIB, 15, 2), ("2g.20gb", H100_MIB, 14, 2),
     ("3g.40gb", H100_MIB, 9, 4), ("4g.40gb", H100_MIB, 5, 4), ("7g.80gb", H100_MIB, 0, 8),
     ("1g.10gb+me", H100_MIB, 20, 1), ("1g.5gb", A100_MIB, 19, 1), ("2g.10gb", A100_MIB, 14, 2),
     ("3g.20gb", A100_MIB, 9, 4), ("4g.20gb", A100_MIB, 5, 4), ("7g.40gb", A100_MIB, 0, 8),
     ("1g.10gb", A100_MIB, 15, 2), ("1c.3g.40gb", H100_MIB, 9, 4), ("6g.70gb", H100_MIB, None, 7)],
)  # fmt: skip
def test_nvidias_gi_profile_ids_and_sizes(
    profile: str, memory_mib: int, gi_profile_id: int | None, slices: int
) -> None:
    assert default_gi_profile_id(profile, memory_mib) == gi_profile_id
    assert mig_memory_slices(profile, memory_mib) == slices


def test_placements_pack_without_overlap() -> None:
    assert pack_placements([4, 2, 1, 1]) == [0, 4, 6, 7]
    assert pack_placements([1, 4], taken=[(0, 4)]) == [4, 4 + 4]
    assert pack_placements([2, 2, 2, 2, 1]) == [0, 2, 4, 6, 8]  # a made-up layout runs past slice 7


@pytest.mark.parametrize(
    ("cc", "arch"),
    [((3, 7), "Kepler"), ((6, 0), "Pascal"), ((7, 0), "Volta"), ((7, 5), "Turing"), ((8, 0), "Ampere"),
     ((8, 6), "Ampere"), ((8, 9), "Ada Lovelace"), ((9, 0), "Hopper"), ((10, 0), "Blackwell"),
     ((12, 0), "Blackwell"), ((2, 0), "Unknown")],
)  # fmt: skip
def test_architecture_from_compute_capability(cc: tuple[int, int], arch: str) -> None:
    assert architecture_from_cc(cc) == arch


def test_profile_defaults_and_given_values() -> None:
    gb200 = load_profile(PROFILES_DIR / "gb200-nvl-4.yaml").gpus[0]
    assert (gb200.brand, gb200.architecture, gb200.pcie_root) == ("Nvidia", "Blackwell", None)
    t4 = load_profile(PROFILES_DIR / "t4.yaml").gpus[0]
    assert (t4.brand, t4.architecture) == ("Tesla", "Turing")
    h100 = load_profile(PROFILES_DIR / "h100-mig-8.yaml").gpus[0]
    assert h100.pcie_root == "pci0000:15"
    doc = mig_profile([{"profile": "1g.10gb"}], brand="NvidiaRTX", architecture="Ada Lovelace",
                      pcie_root="pci0001:a0")  # fmt: skip
    gpu = inventory_from_profile(doc).gpus[0]
    assert (gpu.brand, gpu.architecture, gpu.pcie_root) == ("NvidiaRTX", "Ada Lovelace", "pci0001:a0")


def test_mig_facts_given_derived_and_shared_by_compute_instances() -> None:
    doc = mig_profile([
        {"profile": "1g.10gb"},
        {"profile": "3g.40gb", "placement_start": 0},
        {"profile": "2g.20gb", "gi_profile_id": 14},
        {"profile": "1c.2g.20gb", "ci_id": 1},
    ])  # fmt: skip
    doc["gpus"][0]["mig_devices"][3]["gi_id"] = 3  # a second compute instance of the 2g.20gb instance
    assert facts(doc) == [(19, 4, 1), (9, 0, 4), (14, 6, 2), (14, 6, 2)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"brand": "Acme"}, "gpus[0].brand: expected one of Unknown, Quadro, Tesla"),
        ({"architecture": "Fermi"}, "gpus[0].architecture: expected one of Kepler"),
        ({"pcie_root": "0000:16"}, "gpus[0].pcie_root: expected a PCIe root complex like 'pci0000:16'"),
        ({"addressing_mode": "ats"}, "gpus[0].addressing_mode: expected one of None, HMM, ATS, got 'ats'"),
    ],
)
def test_gpu_fact_errors(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        inventory_from_profile(mig_profile([], mig_enabled=False, **change))
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("migs", "message"),
    [
        ([{"profile": "1g.10gb", "placement_size": 9}], "placement_size: expected 1..8 memory slices, got 9"),
        ([{"profile": "1g.10gb", "gi_profile_id": -1}], "gi_profile_id: required, expected a non-negative"),
        ([{"profile": "2g.20gb", "placement_start": 0}, {"profile": "1g.10gb", "placement_start": 1}],
         "mig_devices[1].placement_start: slices 1..1 overlap GPU instance 1 (slices 0..1)"),
        ([{"profile": "6g.70gb", "placement_start": 0}], "a placement needs gi_profile_id too"),
    ],
)  # fmt: skip
def test_mig_fact_errors(migs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        inventory_from_profile(mig_profile(migs))
    assert message in str(err.value)


@pytest.mark.slow
def test_stand_in_nvml_reports_the_profiles_facts(
    tmp_path: Path, nvml_library: Path, run_py: RunPy
) -> None:
    doc = mig_profile(
        [{"profile": "1g.10gb+me"}, {"profile": "3g.40gb", "placement_start": 4, "gi_profile_id": 9},
         {"profile": "6g.70gb"}],
        brand="GeForceRTX", architecture="Unknown", pcie_root="pci0000:16",
    )  # fmt: skip
    profile = tmp_path / "node.yaml"
    profile.write_text(json.dumps(doc))
    node = NodeSim(profile, tmp_path / "state")
    result = run_py(DISCOVER, node.env)
    assert result.returncode == 0, result.stderr
    found = parse(result.stdout)
    assert found == node.inventory
    gpu = found.gpus[0]
    assert (gpu.brand, gpu.architecture, gpu.pcie_root) == ("GeForceRTX", "Unknown", "pci0000:16")
    assert [(m.gi_profile_id, m.placement_start, m.placement_size) for m in gpu.mig_devices] == [
        (20, 0, 1), (9, 4, 4), (None, None, None)
    ]  # fmt: skip


@pytest.mark.slow
def test_stand_in_nvml_reports_the_addressing_mode_of_coherent_systems(
    tmp_path: Path, nvml_library: Path, run_py: RunPy
) -> None:
    # go-nvlib's names for NVML's HMM, ATS and NONE; a GPU whose profile gives none is not a coherent
    # system: NOT_SUPPORTED, and no mode
    doc = mig_profile([], mig_enabled=False)
    base = doc["gpus"][0]
    doc["gpus"] = [
        {**base, "index": i, "uuid": f"GPU-{i}", "minor": i, "pci_bus_id": f"00000000:1{i}:00.0", **mode}
        for i, mode in enumerate([{"addressing_mode": "ATS"}, {"addressing_mode": "HMM"},
                                  {"addressing_mode": "None"}, {}])
    ]  # fmt: skip
    profile = tmp_path / "node.yaml"
    profile.write_text(json.dumps(doc))
    node = NodeSim(profile, tmp_path / "state")
    result = run_py(DISCOVER, node.env)
    assert result.returncode == 0, result.stderr
    found = parse(result.stdout)
    assert [g.addressing_mode for g in found.gpus] == ["ATS", "HMM", "None", ""]
    assert found == node.inventory


def test_the_gb200_profile_is_a_coherent_system() -> None:
    assert {g.addressing_mode for g in load_profile(PROFILES_DIR / "gb200-nvl-4.yaml").gpus} == {"ATS"}
    assert load_profile(PROFILES_DIR / "t4.yaml").gpus[0].addressing_mode == ""


def test_pcie_root_from_sysfs_links(tmp_path: Path) -> None:
    device = tmp_path / "devices/pci0000:16/0000:16:01.0/0000:17:00.0"
    device.mkdir(parents=True)
    links = tmp_path / "bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:17:00.0").symlink_to("../../../devices/pci0000:16/0000:16:01.0/0000:17:00.0")
    (links / "0000:18:00.0").mkdir()  # not a link: no root to tell
    (links / "0000:19:00.0").symlink_to(tmp_path / "devices/pci0000:16/0000:16:01.0/0000:17:00.0")
    (links / "0000:1a:00.0").symlink_to(f"{os.sep}sys/devices/pci0000:3a/0000:3a:01.0/0000:1a:00.0")
    assert nvml.pcie_root("00000000:17:00.0", str(tmp_path)) == "pci0000:16"
    assert nvml.pcie_root("00000000:18:00.0", str(tmp_path)) is None
    assert nvml.pcie_root("00000000:19:00.0", str(tmp_path)) is None  # points at another device
    assert nvml.pcie_root("00000000:1A:00.0", str(tmp_path)) == "pci0000:3a"
    assert nvml.pcie_root("00000000:1b:00.0", str(tmp_path)) is None


def raising(code: int) -> Callable[..., Any]:
    def call(*_: Any) -> Any:
        raise pynvml.NVMLError(code)

    return call


def test_missing_calls_leave_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlDeviceGetArchitecture", raising(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    assert nvml._architecture(None, (9, 0)) == "Hopper"
    monkeypatch.setattr(pynvml, "nvmlDeviceGetArchitecture", raising(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert nvml._architecture(None, (9, 0)) == ""
    monkeypatch.setattr(pynvml, "nvmlDeviceGetBrand", raising(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    assert nvml._brand(None) == ""
    for absent in (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED):
        monkeypatch.setattr(pynvml, "nvmlDeviceGetAddressingMode", raising(absent))
        assert nvml._addressing_mode(None) == ""
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuInstanceById", raising(pynvml.NVML_ERROR_NO_PERMISSION))
    assert nvml._gpu_instance(None, 3) == (None, None, None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuInstanceById", raising(pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(pynvml.NVMLError):
        nvml._gpu_instance(None, 3)
