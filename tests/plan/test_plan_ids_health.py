"""The IDs a container is given (device_container_ids), and Plan.with_health."""

from __future__ import annotations

from plan_factories import config, entry, gpu, gpu_uuid, inventory, mig_uuid

from nvdp.config.model import DeviceIdStrategy
from nvdp.plan import PlannedResource, plan
from nvdp.plan.ids import device_container_ids

H100 = "NVIDIA H100 80GB HBM3"


def container_ids(resource: PlannedResource, ids: list[str], strategy: DeviceIdStrategy) -> list[str]:
    """What Allocate gives a container asking for `ids` (resolved as allocate.resolve_devices does)."""
    devices = [resource.device(i) for i in ids]
    assert all(d is not None for d in devices)
    return device_container_ids([d for d in devices if d is not None], strategy)


def test_uuid_strategy_strips_replica_suffix_and_dedupes_in_request_order() -> None:
    p = plan(config(time_slicing=(entry(replicas=3),)), inventory(gpu(0), gpu(1)))
    r = p.resources[0]
    requested = [f"{gpu_uuid(1)}::2", f"{gpu_uuid(0)}::0", f"{gpu_uuid(1)}::0"]
    assert container_ids(r, requested, "uuid") == [gpu_uuid(1), gpu_uuid(0)]
    assert container_ids(r, requested, "index") == ["1", "0"]


def test_index_strategy_gives_mig_indices() -> None:
    p = plan(config("single"), inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb"))))
    r = p.resources[0]
    assert container_ids(r, [mig_uuid(0, 1), mig_uuid(0, 0)], "index") == ["0:1", "0:0"]
    assert container_ids(r, [mig_uuid(0, 1)], "uuid") == [mig_uuid(0, 1)]


def test_a_gpu_uuid_marks_all_its_replicas_unhealthy() -> None:
    p = plan(config(time_slicing=(entry(replicas=3),)), inventory(gpu(0), gpu(1)))
    sick = p.with_health(frozenset({gpu_uuid(1)}))
    assert [(d.id, d.healthy) for d in sick.resources[0].devices] == [
        (f"{gpu_uuid(g)}::{n}", g == 0) for g in (0, 1) for n in range(3)
    ]
    assert all(d.healthy for d in p.resources[0].devices)  # the original plan is unchanged


def test_a_gpu_uuid_marks_its_mig_devices_in_every_resource() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "3g.40gb")), gpu(1, H100, (9, 0), ("1g.10gb",)))
    sick = plan(config("mixed"), inv).with_health(frozenset({gpu_uuid(0)}))
    assert {d.id: d.healthy for r in sick.resources for d in r.devices} == {
        mig_uuid(0, 0): False,
        mig_uuid(0, 1): False,
        mig_uuid(1, 0): True,
    }


def test_a_mig_uuid_marks_only_that_mig_device_and_its_replicas() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb")))
    p = plan(config("single", time_slicing=(entry(replicas=2),)), inv)
    sick = p.with_health(frozenset({mig_uuid(0, 1)}))
    assert [(d.id, d.healthy) for d in sick.resources[0].devices] == [
        (f"{mig_uuid(0, 0)}::0", True),
        (f"{mig_uuid(0, 0)}::1", True),
        (f"{mig_uuid(0, 1)}::0", False),
        (f"{mig_uuid(0, 1)}::1", False),
    ]


def test_unknown_uuid_changes_nothing() -> None:
    p = plan(config(), inventory(gpu(0)))
    assert p.with_health(frozenset({"GPU-other"})) is p


def test_what_a_health_event_leaves_alone_stays_the_same_object() -> None:
    # The health path finds the resources to update by identity, and unchanged devices keep theirs.
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb",)), gpu(1, H100, (9, 0), ("1g.10gb",)), gpu(2))
    p = plan(config("mixed"), inv)
    sick = p.with_health(frozenset({gpu_uuid(2)}))
    changed = [new is not old for new, old in zip(sick.resources, p.resources, strict=True)]
    assert changed.count(True) == 1
    (old, new), = [(o, n) for o, n in zip(p.resources, sick.resources, strict=True) if o is not n]
    assert [n is o for n, o in zip(new.devices, old.devices, strict=True)] == [d.healthy for d in new.devices]
    assert sick.with_health(frozenset({gpu_uuid(2)})) is sick  # already unhealthy: nothing changes


def test_the_set_is_the_whole_truth_so_a_gpu_left_out_is_healthy_again() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb")), gpu(1))
    p = plan(config("mixed"), inv)
    sick = p.with_health(frozenset({gpu_uuid(0), mig_uuid(0, 1)}))
    assert not any(d.healthy for r in sick.resources for d in r.devices if gpu_uuid(0) in d.gpu_uuids)
    some = sick.with_health(frozenset({mig_uuid(0, 1)}))  # the GPU came back, one MIG device did not
    assert {d.id: d.healthy for r in some.resources for d in r.devices if gpu_uuid(0) in d.gpu_uuids} == {
        mig_uuid(0, 0): True, mig_uuid(0, 1): False}
    assert all(d.healthy for r in some.with_health(frozenset()).resources for d in r.devices)
