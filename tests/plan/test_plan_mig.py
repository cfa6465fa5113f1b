"""MIG strategies, resource patterns and exclusions."""

from __future__ import annotations

import pytest
from plan_factories import config, gpu, gpu_uuid, inventory, mig_uuid

from nvdp.config.model import ResourcePattern
from nvdp.inventory.model import LostGpu
from nvdp.plan import PlanError, plan

H100 = "NVIDIA H100 80GB HBM3"


def names_and_ids(p: object) -> dict[str, list[str]]:
    from nvdp.plan import Plan

    assert isinstance(p, Plan)
    return {r.name: [d.id for d in r.devices] for r in p.resources}


def test_none_advertises_full_gpus_under_nvidia_gpu() -> None:
    p = plan(config(), inventory(gpu(1), gpu(0)))
    assert names_and_ids(p) == {"nvidia.com/gpu": [gpu_uuid(0), gpu_uuid(1)]}
    dev = p.resources[0].devices[0]
    assert (dev.index, dev.gpu_uuids, dev.gpu_indices, dev.minors, dev.replica, dev.mig) == (
        "0",
        (gpu_uuid(0),),
        (0,),
        (0,),
        None,
        None,
    )
    assert p.excluded == () and p.warnings == ()


def test_none_advertises_mig_enabled_gpu_whole_and_warns() -> None:
    p = plan(config("none"), inventory(gpu(0, H100, (9, 0), ("1g.10gb",))))
    assert names_and_ids(p) == {"nvidia.com/gpu": [gpu_uuid(0)]}
    assert p.warnings == (
        "MIG mode is enabled on GPU 0; migStrategy none advertises it as a whole GPU, which CUDA work "
        "cannot use while MIG mode is on: set migStrategy to single or mixed to advertise the MIG "
        "devices, or disable MIG mode (`nvidia-smi -i 0 -mig 0`)",
    )


def test_none_warns_once_for_several_mig_enabled_gpus() -> None:
    inv = inventory(gpu(0), gpu(1, H100, (9, 0), ("1g.10gb",)), gpu(2, H100, (9, 0), ()))
    p = plan(config("none"), inv)
    assert names_and_ids(p) == {"nvidia.com/gpu": [gpu_uuid(0), gpu_uuid(1), gpu_uuid(2)]}
    assert p.warnings == (
        "MIG mode is enabled on GPU 1, 2; migStrategy none advertises them as whole GPUs, which CUDA work "
        "cannot use while MIG mode is on: set migStrategy to single or mixed to advertise the MIG "
        "devices, or disable MIG mode (`nvidia-smi -i 1 -mig 0`)",
    )


def test_single_advertises_mig_devices_as_nvidia_gpu() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb")), gpu(1, H100, (9, 0), ("1g.10gb",)))
    p = plan(config("single"), inv)
    assert names_and_ids(p) == {"nvidia.com/gpu": [mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(1, 0)]}
    dev = p.resources[0].devices[1]
    assert (dev.index, dev.base_id, dev.gpu_uuids, dev.mig, dev.memory_bytes) == (
        "0:1",
        mig_uuid(0, 1),
        (gpu_uuid(0),),
        (2, 0),
        10 * 1024**3,
    )


def test_single_without_mig_gpus_advertises_full_gpus() -> None:
    assert names_and_ids(plan(config("single"), inventory(gpu(0)))) == {"nvidia.com/gpu": [gpu_uuid(0)]}


def test_single_rejects_mixed_mig_enabled_values() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb",)), gpu(1, H100, (9, 0)))
    with pytest.raises(PlanError) as err:
        plan(config("single"), inv)
    assert str(err.value) == (
        "all devices on the node must be configured with the same migEnabled value (MIG enabled on "
        "GPU 0, disabled on GPU 1); enable MIG mode on every GPU, disable it on every GPU, or set "
        "migStrategy to mixed"
    )


def test_single_rejects_more_than_one_profile() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "3g.40gb")))
    with pytest.raises(PlanError) as err:
        plan(config("single"), inv)
    assert str(err.value) == (
        "invalid MIG configuration: more than one MIG device type present on node (1g.10gb, 3g.40gb); "
        "migStrategy single advertises every MIG device as nvidia.com/gpu, so all must have the same "
        "profile: repartition the GPUs to one profile or set migStrategy to mixed"
    )


def test_single_rejects_mig_enabled_gpu_without_mig_devices_with_the_fix() -> None:
    with pytest.raises(PlanError) as err:
        plan(config("single"), inventory(gpu(0, H100, (9, 0), ())))
    assert str(err.value) == (
        "invalid MIG configuration: at least one device with migEnabled=true was not configured "
        f"correctly: device 0 ({gpu_uuid(0)}) has no MIG devices configured; create MIG devices on it "
        "(for example `nvidia-smi mig -i 0 -cgi <profile> -C`, or a mig-parted config) or disable MIG "
        "mode (`nvidia-smi -i 0 -mig 0`)"
    )


def test_mixed_names_one_resource_per_profile_and_keeps_full_gpus() -> None:
    inv = inventory(
        gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb+me", "3g.40gb", "1g.10gb")),
        gpu(1, H100, (9, 0)),
    )
    p = plan(config("mixed"), inv)
    assert names_and_ids(p) == {
        "nvidia.com/gpu": [gpu_uuid(1)],
        "nvidia.com/mig-1g.10gb": [mig_uuid(0, 0), mig_uuid(0, 3)],
        "nvidia.com/mig-1g.10gb.me": [mig_uuid(0, 1)],
        "nvidia.com/mig-3g.40gb": [mig_uuid(0, 2)],
    }
    assert [r.short_name for r in p.resources] == ["gpu", "mig-1g.10gb", "mig-1g.10gb.me", "mig-3g.40gb"]


def test_mixed_excludes_mig_enabled_gpu_without_mig_devices() -> None:
    p = plan(config("mixed"), inventory(gpu(0, H100, (9, 0), ()), gpu(1)))
    assert names_and_ids(p) == {"nvidia.com/gpu": [gpu_uuid(1)]}
    assert [(e.device, e.reason) for e in p.excluded] == [
        (
            gpu_uuid(0),
            "MIG mode is enabled but no MIG devices are configured; create MIG devices on it (for "
            "example `nvidia-smi mig -i 0 -cgi <profile> -C`, or a mig-parted config) or disable MIG "
            "mode (`nvidia-smi -i 0 -mig 0`)",
        )
    ]


def test_mixed_has_no_default_resource_for_partial_compute_profiles() -> None:
    p = plan(config("mixed"), inventory(gpu(0, H100, (9, 0), ("1c.2g.20gb", "2g.20gb"))))
    assert names_and_ids(p) == {"nvidia.com/mig-2g.20gb": [mig_uuid(0, 1)]}
    assert p.excluded[0].device == mig_uuid(0, 0)
    assert p.excluded[0].reason == (
        "MIG profile '1c.2g.20gb' does not match any resource patterns (resources.mig: '2g.20gb' -> "
        "nvidia.com/mig-2g.20gb); add a resources.mig entry whose pattern matches it"
    )


def test_gpu_patterns_first_match_wins_and_unmatched_gpu_is_excluded() -> None:
    patterns = (
        ResourcePattern("*T4", "nvidia.com/t4"),
        ResourcePattern("Tesla*", "nvidia.com/tesla"),
        ResourcePattern("*A100*", "nvidia.com/a100"),
    )
    inv = inventory(gpu(0, "Tesla T4"), gpu(1, "Tesla V100", (7, 0)), gpu(2, "Quadro RTX 8000"))
    p = plan(config(gpus=patterns), inv)
    assert names_and_ids(p) == {"nvidia.com/t4": [gpu_uuid(0)], "nvidia.com/tesla": [gpu_uuid(1)]}
    assert [(e.device, e.reason) for e in p.excluded] == [
        (
            gpu_uuid(2),
            "GPU name 'Quadro RTX 8000' does not match any resource patterns (resources.gpus: "
            "'*T4' -> nvidia.com/t4, 'Tesla*' -> nvidia.com/tesla, '*A100*' -> nvidia.com/a100); add a "
            "resources.gpus entry whose pattern matches it",
        )
    ]


def test_pattern_match_is_anchored_over_the_whole_name() -> None:
    # "T4" must not match "Tesla T4" as a substring; "1g.10gb" must not match "1g.10gb+me".
    p = plan(config(gpus=(ResourcePattern("T4", "nvidia.com/t4"),)), inventory(gpu(0, "Tesla T4")))
    assert p.resources == ()
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb+me")))
    p = plan(config("mixed", migs=(ResourcePattern("1g.10gb", "nvidia.com/mig-small"),)), inv)
    assert names_and_ids(p) == {"nvidia.com/mig-small": [mig_uuid(0, 0)]}
    assert [e.device for e in p.excluded] == [mig_uuid(0, 1)]


def test_mig_patterns_under_mixed_can_group_profiles() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb+me", "3g.40gb")))
    cfg = config(
        "mixed",
        migs=(ResourcePattern("1g.*", "nvidia.com/mig-small"), ResourcePattern("*", "nvidia.com/mig-big")),
    )
    assert names_and_ids(plan(cfg, inv)) == {
        "nvidia.com/mig-big": [mig_uuid(0, 2)],
        "nvidia.com/mig-small": [mig_uuid(0, 0), mig_uuid(0, 1)],
    }


def test_lost_gpus_are_excluded_with_their_reason_in_index_order() -> None:
    lost = (
        LostGpu(index=3, uuid=None, reason="GPU is lost (NVML_ERROR_GPU_IS_LOST)"),
        LostGpu(index=1, uuid=gpu_uuid(1), reason="unknown error reading memory info"),
    )
    p = plan(config(), inventory(gpu(0), gpu(2), lost=lost))
    assert names_and_ids(p) == {"nvidia.com/gpu": [gpu_uuid(0), gpu_uuid(2)]}
    assert [(e.device, e.reason) for e in p.excluded] == [
        (gpu_uuid(1), "unknown error reading memory info"),
        ("GPU 3", "GPU is lost (NVML_ERROR_GPU_IS_LOST)"),
    ]


def test_empty_inventory_gives_empty_plan() -> None:
    assert plan(config(), inventory()) == plan(config("mixed"), inventory())
    assert plan(config(), inventory()).resources == ()
