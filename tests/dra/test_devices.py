"""DRA devices from node profiles: NVIDIA's names, attributes and capacities, within the API's limits."""

from __future__ import annotations

import re

import pytest

from nvdp.dra.pool.devices import (
    ADDRESSING_MODE,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    DraDevice,
    by_name,
    dra_devices,
    semver,
)
from nvdp.dra.pool.names import check_driver_name, gpu_device_name, mig_device_name, rfc1123
from nvdp.inventory.model import Gpu, Inventory, MigDevice
from nvdp.inventory.profile import load_profile
from sim.nvml import list_profiles, resolve_profile

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


def devices(profile: str) -> tuple[DraDevice, ...]:
    return dra_devices(load_profile(resolve_profile(profile)))


def test_t4_is_one_gpu_with_nvidias_attributes() -> None:
    (gpu,) = devices("t4")
    assert gpu.name == "gpu-0" and gpu.kind == "gpu" and gpu.uuid == gpu.gpu_uuid
    assert gpu.attributes == {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": "Tesla T4"},
        "brand": {"string": "Tesla"},
        "architecture": {"string": "Turing"},
        "cudaComputeCapability": {"version": "7.5.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        PCI_BUS_ID: {"string": "0000:00:06.0"},
        NUMA_NODE: {"int": 0},
    }
    assert gpu.capacity == {"memory": {"value": str(15360 * 1024 * 1024)}}


def test_a100_gpus_carry_their_pcie_root() -> None:
    found = devices("a100-sxm-8")
    assert [d.name for d in found] == [f"gpu-{i}" for i in range(8)]
    assert found[0].attributes[PCIE_ROOT] == {"string": "pci0000:05"}
    assert found[0].attributes[PCI_BUS_ID] == {"string": "0000:07:00.0"}
    assert found[0].attributes["architecture"] == {"string": "Ampere"}


def test_h100_mig_publishes_only_mig_devices_with_nvidia_names() -> None:
    found = devices("h100-mig-8")
    assert all(d.kind == "mig" for d in found)
    names = [d.name for d in found]
    assert names[:7] == [f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)]
    assert "gpu-3-mig-7g80gb-0-0" in names
    assert "gpu-4-mig-1g10gb-me-20-6" in names
    assert "gpu-5-mig-4g40gb-5-0" in names and "gpu-5-mig-3g40gb-9-4" in names
    assert "gpu-6-mig-1g20gb-15-0" in names
    assert len(set(names)) == len(names) == 28


def test_mig_device_attributes_and_memory_slices() -> None:
    inventory = load_profile(resolve_profile("h100-mig-8"))
    gpu = inventory.gpus[2]
    mig = gpu.mig_devices[1]  # 3g.40gb, the second GPU instance
    device = by_name(dra_devices(inventory))["gpu-2-mig-3g40gb-9-4"]
    assert device.uuid == mig.uuid and device.gpu_uuid == gpu.uuid
    assert device.attributes["type"] == {"string": "mig"}
    assert device.attributes["parentUUID"] == {"string": gpu.uuid}
    assert device.attributes["profile"] == {"string": "3g.40gb"}
    assert device.attributes["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert device.attributes["architecture"] == {"string": "Hopper"}
    assert device.attributes[PCI_BUS_ID] == {"string": "0000:3a:00.0"}
    assert device.attributes[PCIE_ROOT] == {"string": "pci0000:37"}
    assert device.capacity["multiprocessors"] == {"value": "48"}
    assert device.capacity["memory"] == {"value": str(mig.memory_bytes)}
    slices = sorted(k for k in device.capacity if k.startswith("memorySlice"))
    assert slices == [f"memorySlice{i}" for i in range(4, 8)]
    assert all(device.capacity[k] == {"value": "1"} for k in slices)


@pytest.mark.parametrize("profile", list_profiles())
def test_every_device_stays_within_the_api_limits(profile: str) -> None:
    for device in devices(profile):
        assert DNS_LABEL.match(device.name), device.name
        assert len(device.attributes) + len(device.capacity) <= 32, device.name
        for key in (*device.attributes, *device.capacity):
            domain, _, ident = key.rpartition("/")
            assert C_IDENTIFIER.match(ident), key
            assert len(domain) <= 63
        for value in device.attributes.values():
            ((kind, text),) = value.items()
            assert kind in ("string", "version", "int", "bool")
            if kind in ("string", "version"):
                assert isinstance(text, str) and len(text) <= 64


def test_gpus_on_two_numa_nodes_publish_both_values_on_every_gpu_and_mig_device() -> None:
    # KEP-6072's standard name, an int as NVIDIA publishes it: a claim's matchAttribute puts a GPU and
    # another driver's device on one NUMA node. The profiles' numa_node is what the stand-in's sysfs says.
    mixed = {d.name: d.attributes[NUMA_NODE] for d in devices("mixed-4")}
    assert mixed == {"gpu-0": {"int": 0}, "gpu-1": {"int": 0}, "gpu-2": {"int": 1}, "gpu-3": {"int": 1}}
    mig = devices("h100-mig-8")
    assert {d.attributes[NUMA_NODE]["int"] for d in mig if d.name.startswith("gpu-0-")} == {0}
    assert {d.attributes[NUMA_NODE]["int"] for d in mig if d.name.startswith("gpu-7-")} == {1}


def test_mixed_products_are_told_apart_by_product_name() -> None:
    names = {d.name: d.attributes["productName"]["string"] for d in devices("mixed-4")}
    assert names == {"gpu-0": "Tesla T4", "gpu-1": "Tesla T4", "gpu-2": "Tesla V100-SXM2-16GB",
                     "gpu-3": "Tesla V100-SXM2-16GB"}  # fmt: skip
    archs = [d.attributes["architecture"]["string"] for d in devices("mixed-4")]
    assert archs == ["Turing", "Turing", "Volta", "Volta"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9.0", "9.0.0"), ("570.124.06", "570.124.6"), ("12.4", "12.4.0"), ("550", "550.0.0"),
     ("1.2.3-rc.1", "1.2.3-rc.1"), ("", None), ("abc", None)],
)  # fmt: skip
def test_versions_are_semver_normalised(text: str, expected: str | None) -> None:
    assert semver(text) == expected


@pytest.mark.parametrize(
    ("profile", "part"),
    [("1g.10gb", "1g10gb"), ("1g.10gb+me", "1g10gb-me"), ("1g.24gb-me", "1g24gb-me"),
     ("1g.24gb+me.all", "1g24gb-meall"), ("1c.3g.40gb", "1c3g40gb"), ("7g.80gb", "7g80gb")],
)  # fmt: skip
def test_mig_names_follow_nvidias_rfc1123_rule(profile: str, part: str) -> None:
    gpu = Gpu(index=0, uuid="GPU-a", name="x", memory_bytes=1, compute_capability=(9, 0), minor=3,
              pci_bus_id="00000000:18:00.0", mig_capable=True, mig_enabled=True)  # fmt: skip
    mig = MigDevice(uuid="MIG-a", index=0, parent_uuid="GPU-a", parent_index=0, profile=profile, gi_id=2,
                    ci_id=0, memory_bytes=1, gi_profile_id=19, placement_start=4)  # fmt: skip
    assert mig_device_name(gpu, mig) == f"gpu-3-mig-{part}-19-4"
    assert gpu_device_name(gpu) == "gpu-3"
    assert rfc1123("-A_b.") == "a-b"


def test_mig_name_without_gpu_instance_facts_uses_the_instance_ids() -> None:
    gpu = Gpu(index=0, uuid="GPU-a", name="x", memory_bytes=1, compute_capability=(9, 0), minor=1,
              pci_bus_id="00000000:18:00.0", mig_capable=True, mig_enabled=True)  # fmt: skip
    mig = MigDevice(uuid="MIG-a", index=0, parent_uuid="GPU-a", parent_index=0, profile="1g.10gb", gi_id=7,
                    ci_id=0, memory_bytes=1)  # fmt: skip
    assert mig_device_name(gpu, mig) == "gpu-1-mig-1g10gb-gi7-ci0"


def test_unknown_facts_are_left_out_not_made_up() -> None:
    gpu = Gpu(index=0, uuid="GPU-a", name="x", memory_bytes=1, compute_capability=(9, 0), minor=0,
              pci_bus_id="00000000:18:00.0")  # fmt: skip
    (device,) = dra_devices(Inventory(driver_version="", cuda_driver_version="12.4", gpus=(gpu,)))
    unknown = {"brand", "architecture", "driverVersion", PCIE_ROOT, ADDRESSING_MODE, NUMA_NODE}
    assert unknown.isdisjoint(device.attributes)


def test_coherent_systems_publish_their_addressing_mode_as_nvidia_names_it() -> None:
    # NVIDIA's driver: the attribute `addressingMode`, go-nvlib's name of NVML's mode, on GPUs and on
    # their MIG devices; absent where NVML does not support the call
    assert {d.attributes[ADDRESSING_MODE]["string"] for d in devices("gb200-nvl-4")} == {"ATS"}
    assert ADDRESSING_MODE not in devices("t4")[0].attributes
    mig = MigDevice(uuid="MIG-a", index=0, parent_uuid="GPU-a", parent_index=0, profile="1g.12gb", gi_id=1,
                    ci_id=0, memory_bytes=1)  # fmt: skip
    for mode in ("HMM", "None"):  # supported but inactive is published too ("None")
        gpu = Gpu(index=0, uuid="GPU-a", name="NVIDIA GH200 480GB", memory_bytes=1, compute_capability=(9, 0),
                  minor=0, pci_bus_id="00000009:01:00.0", mig_capable=True, mig_enabled=True,
                  mig_devices=(mig,), addressing_mode=mode)  # fmt: skip
        (device,) = dra_devices(Inventory(driver_version="570.1.2", cuda_driver_version="12.8", gpus=(gpu,)))
        assert device.kind == "mig" and device.attributes[ADDRESSING_MODE] == {"string": mode}


def test_a_gpu_instance_with_two_compute_instances_is_published_once() -> None:
    migs = tuple(
        MigDevice(uuid=f"MIG-{ci}", index=ci, parent_uuid="GPU-a", parent_index=0, profile="1c.2g.20gb",
                  gi_id=3, ci_id=ci, memory_bytes=1, gi_profile_id=14, placement_start=0, placement_size=2)
        for ci in range(2)
    )  # fmt: skip
    gpu = Gpu(index=0, uuid="GPU-a", name="x", memory_bytes=1, compute_capability=(9, 0), minor=0,
              pci_bus_id="00000000:18:00.0", mig_capable=True, mig_enabled=True,
              mig_devices=migs)  # fmt: skip
    found = dra_devices(Inventory(driver_version="550.1", cuda_driver_version="12.4", gpus=(gpu,)))
    assert [d.uuid for d in found] == ["MIG-0"]


@pytest.mark.parametrize(
    ("name", "problem"),
    [("gpu.nvidia.com", None), ("a" * 26, None), ("", "is empty"), ("a" * 27, "has 27 characters"),
     ("GPU.nvidia.com", "not a lower-case DNS subdomain"), ("gpu_nvidia", "not a lower-case DNS subdomain"),
     ("-gpu.x", "not a lower-case DNS subdomain")],
)  # fmt: skip
def test_driver_name_check(name: str, problem: str | None) -> None:
    result = check_driver_name(name)
    if problem is None:
        assert result is None
    else:
        assert result is not None and problem in result and "gpu.nvidia.com" in result
