"""Thread share, pinned-memory limits and the replica cap, per GPU model."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from nvdp.mps.commands import MpsConfigError, max_replicas_per_gpu, mps_settings
from nvdp.mps.daemons import mps_settings_for, plan_mps
from nvdp.plan import Plan, PlannedDevice, PlannedResource, plan

from .nodes import gpu, inventory, mps_config


def test_seed_t4_with_ten_replicas() -> None:
    settings = plan_mps(mps_config(10), inventory(gpu(0)))
    assert len(settings) == 1
    assert settings[0].commands == (
        "set_default_active_thread_percentage 10",
        "set_default_device_pinned_mem_limit 0 1536M",
    )
    assert settings[0].visible_devices == "GPU-00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize(
    ("name", "memory_mib", "cc", "replicas", "percentage", "limit"),
    [
        ("Tesla T4", 15360, (7, 5), 3, 33, "5120M"),
        ("Tesla V100-SXM2-16GB", 16384, (7, 0), 7, 14, "2340M"),
        ("NVIDIA A100-SXM4-80GB", 81920, (8, 0), 48, 2, "1706M"),
        ("NVIDIA H100 80GB HBM3", 81559, (9, 0), 2, 50, "40779M"),
    ],
)
def test_arithmetic_per_gpu_model(
    name: str, memory_mib: int, cc: tuple[int, int], replicas: int, percentage: int, limit: str
) -> None:
    inv = inventory(gpu(0, name, memory_mib, cc), gpu(1, name, memory_mib, cc))
    (settings,) = plan_mps(mps_config(replicas), inv)
    assert settings.commands == (
        f"set_default_active_thread_percentage {percentage}",
        f"set_default_device_pinned_mem_limit 0 {limit}",
        f"set_default_device_pinned_mem_limit 1 {limit}",
    )


def test_pre_volta_gets_no_memory_limit() -> None:
    (settings,) = plan_mps(mps_config(4), inventory(gpu(0, "Tesla P100-PCIE-16GB", 16280, (6, 0))))
    assert settings.commands == ("set_default_active_thread_percentage 25",)
    assert "no memory limit" in settings.describe()


def test_zero_memory_skips_the_limit() -> None:
    (settings,) = plan_mps(mps_config(2), inventory(gpu(0, memory_mib=0)))
    assert settings.commands == ("set_default_active_thread_percentage 50",)


def test_replica_cap() -> None:
    assert max_replicas_per_gpu((7, 5)) == 48
    assert max_replicas_per_gpu((9, 0)) == 48
    assert max_replicas_per_gpu((7, 0)) == 16
    assert max_replicas_per_gpu((6, 1)) == 16


def _shared(inv_gpu_uuid: str, replicas: int) -> PlannedResource:
    base = PlannedDevice(
        id="",
        base_id=inv_gpu_uuid,
        index="0",
        gpu_uuids=(inv_gpu_uuid,),
        gpu_indices=(0,),
        minors=(0,),
        numa_node=None,
        memory_bytes=0,
    )
    devices = tuple(replace(base, id=f"{inv_gpu_uuid}::{n}", replica=n) for n in range(replicas))
    return PlannedResource(name="nvidia.com/gpu", devices=devices, sharing="mps", replicas=replicas)


def test_daemon_checks_the_cap_again() -> None:
    # The plan refuses this already; the daemon must not trust a plan it did not make.
    t4 = gpu(0, "Tesla V100-PCIE-16GB", 16384, (7, 0))
    with pytest.raises(MpsConfigError) as err:
        mps_settings(_shared(t4.uuid, 17), inventory(t4))
    assert str(err.value) == (
        "invalid MPS configuration: resource nvidia.com/gpu asks for 17 replicas of GPU 0 "
        "(Tesla V100-PCIE-16GB, compute capability 7.0), more than the 16 MPS clients it supports; "
        "set sharing.mps.resources[].replicas to 16 or less"
    )


def test_mig_devices_refused() -> None:
    t4 = gpu(0)
    mig = replace(_shared(t4.uuid, 2).devices[0], id="MIG-abc::0", base_id="MIG-abc", mig=(1, 0))
    resource = PlannedResource(name="nvidia.com/mig-1g.10gb", devices=(mig,), sharing="mps", replicas=2)
    with pytest.raises(MpsConfigError) as err:
        mps_settings_for(Plan(resources=(resource,)), inventory(t4))
    assert str(err.value) == (
        "sharing using MPS is not supported for MIG devices: resource nvidia.com/mig-1g.10gb holds "
        "MIG-abc::0; share MIG devices with sharing.timeSlicing, or set flags.migStrategy=none to "
        "share whole GPUs with MPS"
    )


def test_unshared_resources_get_no_daemon() -> None:
    inv = inventory(gpu(0))
    unshared = plan(replace(mps_config(), sharing=replace(mps_config().sharing, mps=None)), inv)
    assert mps_settings_for(unshared, inv) == []
