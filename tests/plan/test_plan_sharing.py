"""Time-slicing and MPS replicas, rename, device subsets and their errors."""

from __future__ import annotations

import pytest
from plan_factories import config, entry, gpu, gpu_uuid, inventory, mig_uuid

from nvdp.config.model import DeviceSelection, ReplicatedResources, Sharing
from nvdp.plan import Plan, PlanError, plan

H100 = "NVIDIA H100 80GB HBM3"


def ids(p: Plan, name: str) -> list[str]:
    resource = p.resource(name)
    assert resource is not None, f"{name} not in {[r.name for r in p.resources]}"
    return [d.id for d in resource.devices]


def test_time_slicing_ten_replicas_on_one_t4() -> None:
    p = plan(config(time_slicing=(entry(replicas=10),)), inventory(gpu(0)))
    assert [r.name for r in p.resources] == ["nvidia.com/gpu"]
    r = p.resources[0]
    assert len(r.devices) == 10
    assert ids(p, "nvidia.com/gpu") == [f"{gpu_uuid(0)}::{n}" for n in range(10)]
    assert (r.sharing, r.replicas, r.source_name, r.fail_requests_greater_than_one) == (
        "time-slicing",
        10,
        "nvidia.com/gpu",
        False,
    )
    assert {(d.base_id, d.index) for d in r.devices} == {(gpu_uuid(0), "0")}
    assert [d.replica for d in r.devices] == list(range(10))


def test_replicas_are_ordered_by_gpu_then_replica() -> None:
    p = plan(config(time_slicing=(entry(replicas=2),)), inventory(gpu(1), gpu(0)))
    assert ids(p, "nvidia.com/gpu") == [
        f"{gpu_uuid(0)}::0",
        f"{gpu_uuid(0)}::1",
        f"{gpu_uuid(1)}::0",
        f"{gpu_uuid(1)}::1",
    ]


def test_fail_requests_greater_than_one_is_carried() -> None:
    p = plan(config(time_slicing=(entry(replicas=2),), fail_gt1=True), inventory(gpu(0)))
    assert p.resources[0].fail_requests_greater_than_one is True


def test_rename_moves_all_devices_to_the_new_name() -> None:
    cfg = config(time_slicing=(entry(replicas=4, rename="nvidia.com/gpu.shared"),))
    p = plan(cfg, inventory(gpu(0), gpu(1)))
    assert [r.name for r in p.resources] == ["nvidia.com/gpu.shared"]
    r = p.resources[0]
    assert (len(r.devices), r.source_name, r.short_name) == (8, "nvidia.com/gpu", "gpu.shared")


def test_replicas_one_means_unshared() -> None:
    cfg = config(time_slicing=(entry(replicas=1, rename="nvidia.com/gpu.shared"),))
    p = plan(cfg, inventory(gpu(0)))
    assert [(r.name, r.sharing, r.replicas) for r in p.resources] == [("nvidia.com/gpu", "none", 1)]
    assert ids(p, "nvidia.com/gpu") == [gpu_uuid(0)]


def test_device_count_shares_the_first_devices_and_keeps_the_rest_unshared() -> None:
    cfg = config(
        time_slicing=(
            entry(replicas=3, rename="nvidia.com/gpu.shared", devices=DeviceSelection(all=False, count=2)),
        )
    )
    p = plan(cfg, inventory(gpu(0), gpu(1), gpu(2)))
    assert ids(p, "nvidia.com/gpu") == [gpu_uuid(2)]
    assert ids(p, "nvidia.com/gpu.shared") == [f"{gpu_uuid(g)}::{n}" for g in (0, 1) for n in range(3)]
    assert p.warnings == ()


def test_device_count_above_the_node_count_shares_all_and_warns() -> None:
    cfg = config(time_slicing=(entry(replicas=2, devices=DeviceSelection(all=False, count=4)),))
    p = plan(cfg, inventory(gpu(0)))
    assert ids(p, "nvidia.com/gpu") == [f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]
    assert p.warnings == (
        "sharing.timeSlicing.resources[0]: devices: 4 asks for more devices than nvidia.com/gpu has on "
        "this node (1); sharing all 1",
    )


@pytest.mark.parametrize(
    "ref",
    ["1", gpu_uuid(1)],
)
def test_device_refs_select_a_gpu_by_index_or_uuid(ref: str) -> None:
    sel = DeviceSelection(all=False, refs=(ref,))
    cfg = config(time_slicing=(entry(replicas=2, rename="nvidia.com/gpu.shared", devices=sel),))
    p = plan(cfg, inventory(gpu(0), gpu(1)))
    assert ids(p, "nvidia.com/gpu") == [gpu_uuid(0)]
    assert ids(p, "nvidia.com/gpu.shared") == [f"{gpu_uuid(1)}::0", f"{gpu_uuid(1)}::1"]


@pytest.mark.parametrize(
    "ref",
    ["0:1", mig_uuid(0, 1), f"MIG-{gpu_uuid(0)}/2/0"],
)
def test_device_refs_select_a_mig_device_by_index_or_uuid(ref: str) -> None:
    sel = DeviceSelection(all=False, refs=(ref,))
    cfg = config("single", time_slicing=(entry(replicas=2, rename="nvidia.com/gpu.shared", devices=sel),))
    p = plan(cfg, inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb"))))
    assert ids(p, "nvidia.com/gpu") == [mig_uuid(0, 0)]
    assert ids(p, "nvidia.com/gpu.shared") == [f"{mig_uuid(0, 1)}::0", f"{mig_uuid(0, 1)}::1"]
    shared = p.resources[1].devices[0]
    assert (shared.index, shared.mig, shared.base_id) == ("0:1", (2, 0), mig_uuid(0, 1))


def test_device_ref_matching_nothing_warns() -> None:
    sel = DeviceSelection(all=False, refs=("0", "7"))
    cfg = config(time_slicing=(entry(replicas=2, devices=sel),))
    p = plan(cfg, inventory(gpu(0)))
    assert ids(p, "nvidia.com/gpu") == [f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]
    assert p.warnings == (
        "sharing.timeSlicing.resources[0]: device '7' is not one of the 1 device(s) of nvidia.com/gpu "
        "on this node (0); it is not shared",
    )


def test_subset_without_rename_collides_with_the_unshared_rest() -> None:
    cfg = config(time_slicing=(entry(replicas=2, devices=DeviceSelection(all=False, refs=("0",))),))
    with pytest.raises(PlanError) as err:
        plan(cfg, inventory(gpu(0), gpu(1)))
    assert str(err.value) == (
        "sharing.timeSlicing.resources[0] shares 1 of the 2 devices of nvidia.com/gpu without a rename, "
        "so nvidia.com/gpu would hold shared and unshared devices at once; set `rename` (for example "
        "nvidia.com/gpu.shared) or share all its devices"
    )


def test_rename_onto_an_existing_resource_collides() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "3g.40gb")))
    cfg = config("mixed", time_slicing=(entry("nvidia.com/mig-1g.10gb", 2, rename="nvidia.com/mig-3g.40gb"),))
    with pytest.raises(PlanError) as err:
        plan(cfg, inv)
    assert str(err.value) == (
        "sharing.timeSlicing.resources[0] would advertise nvidia.com/mig-3g.40gb, which the unshared "
        "devices of nvidia.com/mig-3g.40gb already advertises; give each shared resource its own `rename`"
    )


def test_two_entries_renamed_to_the_same_name_collide() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "3g.40gb")))
    cfg = config(
        "mixed",
        time_slicing=(
            entry("nvidia.com/mig-1g.10gb", 2, rename="nvidia.com/mig-shared"),
            entry("nvidia.com/mig-3g.40gb", 2, rename="nvidia.com/mig-shared"),
        ),
    )
    with pytest.raises(PlanError) as err:
        plan(cfg, inv)
    assert str(err.value) == (
        "sharing.timeSlicing.resources[1] would advertise nvidia.com/mig-shared, which "
        "sharing.timeSlicing.resources[0] already advertises; give each shared resource its own `rename`"
    )


def test_a_device_in_two_entries_is_an_error() -> None:
    cfg = config(
        time_slicing=(
            entry(replicas=2, rename="nvidia.com/gpu.a"),
            entry(replicas=4, rename="nvidia.com/gpu.b", devices=DeviceSelection(all=False, refs=("0",))),
        )
    )
    with pytest.raises(PlanError) as err:
        plan(cfg, inventory(gpu(0)))
    assert str(err.value) == (
        f"sharing.timeSlicing.resources[1]: device 0 ({gpu_uuid(0)}) of nvidia.com/gpu is already shared "
        "by sharing.timeSlicing.resources[0]; a device can be in one sharing entry only: give the "
        "entries disjoint `devices` lists"
    )


def test_two_entries_split_one_resource_into_two_shared_resources() -> None:
    cfg = config(
        time_slicing=(
            entry(replicas=2, rename="nvidia.com/gpu.a", devices=DeviceSelection(all=False, refs=("0",))),
            entry(replicas=3, rename="nvidia.com/gpu.b", devices=DeviceSelection(all=False, refs=("1",))),
        )
    )
    p = plan(cfg, inventory(gpu(0), gpu(1)))
    assert [(r.name, len(r.devices), r.replicas) for r in p.resources] == [
        ("nvidia.com/gpu.a", 2, 2),
        ("nvidia.com/gpu.b", 3, 3),
    ]


def test_time_slicing_of_mig_devices_under_mixed() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb", "3g.40gb")))
    p = plan(config("mixed", time_slicing=(entry("nvidia.com/mig-1g.10gb", 2),)), inv)
    assert ids(p, "nvidia.com/mig-1g.10gb") == [f"{mig_uuid(0, j)}::{n}" for j in (0, 1) for n in (0, 1)]
    assert ids(p, "nvidia.com/mig-3g.40gb") == [mig_uuid(0, 2)]
    assert p.resource("nvidia.com/mig-3g.40gb").sharing == "none"  # type: ignore[union-attr]


def test_entry_for_a_missing_resource_warns_with_the_existing_names() -> None:
    cfg = config(time_slicing=(entry("nvidia.com/mig-1g.10gb", 2), entry(replicas=2)))
    p = plan(cfg, inventory(gpu(0)))
    assert ids(p, "nvidia.com/gpu") == [f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]
    assert p.warnings == (
        "sharing.timeSlicing.resources[0]: no resource named nvidia.com/mig-1g.10gb on this node "
        "(resources: nvidia.com/gpu); the entry has no effect",
    )


def test_entry_on_a_node_without_gpus_warns() -> None:
    p = plan(config(time_slicing=(entry(replicas=2),)), inventory())
    assert p.warnings == (
        "sharing.timeSlicing.resources[0]: no resource named nvidia.com/gpu on this node "
        "(resources: none); the entry has no effect",
    )


def test_mps_replicas() -> None:
    p = plan(config(mps=(entry(replicas=10),)), inventory(gpu(0)))
    r = p.resources[0]
    assert (r.name, r.sharing, r.replicas, len(r.devices), r.fail_requests_greater_than_one) == (
        "nvidia.com/gpu",
        "mps",
        10,
        10,
        True,
    )


@pytest.mark.parametrize(
    ("cc", "cap"),
    [((7, 5), 48), ((9, 0), 48), ((7, 0), 16), ((6, 1), 16)],
)
def test_mps_replica_cap_depends_on_compute_capability(cc: tuple[int, int], cap: int) -> None:
    inv = inventory(gpu(0, "Some GPU", cc))
    assert len(plan(config(mps=(entry(replicas=cap),)), inv).resources[0].devices) == cap
    with pytest.raises(PlanError) as err:
        plan(config(mps=(entry(replicas=cap + 1),)), inv)
    assert str(err.value) == (
        f"sharing.mps.resources[0] (nvidia.com/gpu): {cap + 1} MPS replicas on GPU 0 (Some GPU, "
        f"{gpu_uuid(0)}) exceed the maximum of {cap} MPS clients for a GPU of compute capability "
        f"{cc[0]}.{cc[1]}; set replicas to {cap} or less"
    )


def test_mps_on_mig_devices_is_an_error_with_the_fix() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb",)))
    with pytest.raises(PlanError) as err:
        plan(config("single", mps=(entry(replicas=2),)), inv)
    assert str(err.value) == (
        "sharing.mps.resources[0] (nvidia.com/gpu): sharing using MPS is not supported for MIG devices "
        f"(MIG device 0:0, {mig_uuid(0, 0)}); share MIG devices with sharing.timeSlicing instead, or "
        "leave this resource out of sharing.mps"
    )


def test_mps_wins_over_time_slicing_with_a_warning() -> None:
    cfg = config(mps=(entry(replicas=4),), time_slicing=(entry(replicas=8),))
    p = plan(cfg, inventory(gpu(0)))
    assert (p.resources[0].sharing, p.resources[0].replicas) == ("mps", 4)
    assert p.warnings == (
        "sharing.timeSlicing is ignored because sharing.mps is set; a node uses one sharing strategy: "
        "remove one of the two blocks",
    )


def test_mps_with_replicas_one_leaves_time_slicing_in_effect() -> None:
    cfg = config(mps=(entry(replicas=1),), time_slicing=(entry(replicas=3),))
    p = plan(cfg, inventory(gpu(0)))
    assert (p.resources[0].sharing, p.resources[0].replicas) == ("time-slicing", 3)


def test_sharing_blocks_with_only_unshared_entries_change_nothing() -> None:
    sharing = Sharing(time_slicing=ReplicatedResources((entry(replicas=1),)))
    cfg = config()
    p = plan(type(cfg)(flags=cfg.flags, sharing=sharing), inventory(gpu(0)))
    assert [(r.name, r.sharing, [d.id for d in r.devices]) for r in p.resources] == [
        ("nvidia.com/gpu", "none", [gpu_uuid(0)])
    ]


def test_entry_whose_refs_all_miss_shares_nothing() -> None:
    sel = DeviceSelection(all=False, refs=("5",))
    cfg = config(time_slicing=(entry(replicas=2, rename="nvidia.com/gpu.shared", devices=sel),))
    p = plan(cfg, inventory(gpu(0)))
    assert [(r.name, [d.id for d in r.devices]) for r in p.resources] == [("nvidia.com/gpu", [gpu_uuid(0)])]
    assert p.warnings == (
        "sharing.timeSlicing.resources[0]: device '5' is not one of the 1 device(s) of nvidia.com/gpu "
        "on this node (0); it is not shared",
    )


def test_mps_on_a_mig_enabled_gpu_under_none_is_an_error() -> None:
    inv = inventory(gpu(0), gpu(1, H100, (9, 0), ("1g.10gb",)))
    with pytest.raises(PlanError) as err:
        plan(config("none", mps=(entry(replicas=2),)), inv)
    assert str(err.value) == (
        "sharing.mps.resources[0] (nvidia.com/gpu): sharing using MPS is not supported for MIG devices "
        f"(GPU 1, {gpu_uuid(1)}, has MIG mode enabled); disable MIG mode on it (`nvidia-smi -i 1 -mig 0`), "
        "or share it with sharing.timeSlicing instead"
    )


def test_empty_device_list_shares_nothing() -> None:
    cfg = config(time_slicing=(entry(replicas=2, devices=DeviceSelection(all=False)),))
    p = plan(cfg, inventory(gpu(0)))
    assert [(r.name, r.sharing, len(r.devices)) for r in p.resources] == [("nvidia.com/gpu", "none", 1)]
