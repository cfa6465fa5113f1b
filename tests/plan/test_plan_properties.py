"""Properties over generated inventories and configs: nothing lost, nothing doubled, IDs consistent."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from plan_factories import config, entry, gpu, gpu_uuid, inventory

from nvdp.config.model import Config, DeviceSelection, MigStrategy, ReplicatedResource
from nvdp.inventory.model import Inventory, LostGpu
from nvdp.plan import Plan, PlanError, plan
from nvdp.plan.model import REPLICA_SEPARATOR
from nvdp.plan.sharing import device_sort_key

PROFILES = ("1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb", "1c.2g.20gb")
NAMES = ("Tesla T4", "NVIDIA A100-SXM4-40GB", "Tesla P100-PCIE-16GB")
RESOURCE_NAMES = ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/other")


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    count = draw(st.integers(0, 5))
    slots = draw(st.permutations(range(count + 2)))  # indices with gaps, some for lost GPUs
    gpus = []
    for index in sorted(slots[:count]):
        mig = draw(st.one_of(st.none(), st.lists(st.sampled_from(PROFILES), max_size=3)))
        cc = draw(st.sampled_from([(6, 0), (7, 0), (7, 5), (8, 0), (9, 0)]))
        gpus.append(gpu(index, draw(st.sampled_from(NAMES)), cc, None if mig is None else tuple(mig)))
    lost = tuple(
        LostGpu(index=i, uuid=draw(st.sampled_from([None, gpu_uuid(i)])), reason=f"GPU {i} fell off the bus")
        for i in slots[count:]
        if draw(st.booleans())
    )
    return inventory(*gpus, lost=lost)


@st.composite
def selections(draw: st.DrawFn) -> DeviceSelection:
    kind = draw(st.sampled_from(["all", "count", "refs"]))
    if kind == "count":
        return DeviceSelection(all=False, count=draw(st.integers(1, 4)))
    if kind == "refs":
        refs = draw(
            st.lists(st.sampled_from(["0", "1", "2", "0:0", "1:1", gpu_uuid(0), gpu_uuid(3)]), max_size=3)
        )
        return DeviceSelection(all=False, refs=tuple(refs)) if refs else DeviceSelection()
    return DeviceSelection()


@st.composite
def entries(draw: st.DrawFn) -> tuple[ReplicatedResource, ...]:
    out = []
    for i in range(draw(st.integers(0, 3))):
        rename = draw(st.sampled_from([None, f"nvidia.com/shared-{i}"]))
        out.append(
            entry(draw(st.sampled_from(RESOURCE_NAMES)), draw(st.integers(1, 4)), rename, draw(selections()))
        )
    return tuple(out)


@st.composite
def configs(draw: st.DrawFn) -> Config:
    strategy: MigStrategy = draw(st.sampled_from(["none", "single", "mixed"]))
    sharing = draw(st.sampled_from(["none", "time-slicing", "mps"]))
    shared = draw(entries())
    if sharing == "time-slicing":
        return config(strategy, time_slicing=shared, fail_gt1=draw(st.booleans()))
    if sharing == "mps":
        return config(strategy, mps=shared)
    return config(strategy)


def physical_units(cfg: Config, inv: Inventory) -> set[str]:
    """What must be advertised or excluded: GPUs, or MIG devices where the strategy uses them."""
    units = {lost.uuid or f"GPU {lost.index}" for lost in inv.lost}
    for g in inv.gpus:
        if cfg.flags.mig_strategy == "none" or not g.mig_enabled or not g.mig_devices:
            units.add(g.uuid)
        else:
            units.update(m.uuid for m in g.mig_devices)
    return units


def planned(cfg: Config, inv: Inventory) -> Plan | None:
    try:
        return plan(cfg, inv)
    except PlanError as err:
        assert str(err)  # every refusal explains itself
        return None


@settings(max_examples=300, deadline=None)
@given(configs(), inventories())
def test_every_device_is_advertised_once_or_excluded_with_a_reason(cfg: Config, inv: Inventory) -> None:
    p = planned(cfg, inv)
    if p is None:
        return
    owners: dict[str, str] = {}
    for r in p.resources:
        for base_id in {d.base_id for d in r.devices}:
            assert base_id not in owners, f"{base_id} in {owners.get(base_id)} and {r.name}"
            owners[base_id] = r.name
    excluded = Counter(e.device for e in p.excluded)
    assert all(n == 1 for n in excluded.values()), excluded
    assert all(e.reason for e in p.excluded)
    assert not set(owners) & set(excluded)
    assert set(owners) | set(excluded) == physical_units(cfg, inv)


@settings(max_examples=300, deadline=None)
@given(configs(), inventories())
def test_ids_are_unique_and_counts_match_replicas(cfg: Config, inv: Inventory) -> None:
    p = planned(cfg, inv)
    if p is None:
        return
    all_ids = [d.id for r in p.resources for d in r.devices]
    assert len(all_ids) == len(set(all_ids))
    for r in p.resources:
        assert r.devices, f"{r.name} advertised with no devices"
        bases = Counter(d.base_id for d in r.devices)
        assert set(bases.values()) == {r.replicas}
        assert len(r.devices) == r.replicas * len(bases)
        assert list(r.devices) == sorted(r.devices, key=device_sort_key)
        for d in r.devices:
            if r.sharing == "none":
                assert (d.id, d.replica, r.replicas) == (d.base_id, None, 1)
            else:
                assert d.id == f"{d.base_id}{REPLICA_SEPARATOR}{d.replica}"
                assert r.replicas >= 2


@settings(max_examples=150, deadline=None)
@given(configs(), inventories())
def test_plan_does_not_depend_on_inventory_order(cfg: Config, inv: Inventory) -> None:
    shuffled = replace(inv, gpus=tuple(reversed(inv.gpus)), lost=tuple(reversed(inv.lost)))
    assert planned(cfg, inv) == planned(cfg, shuffled)


@settings(max_examples=150, deadline=None)
@given(configs(), inventories(), st.data())
def test_unhealthy_gpu_marks_exactly_the_devices_on_it(
    cfg: Config, inv: Inventory, data: st.DataObject
) -> None:
    p = planned(cfg, inv)
    if p is None or not inv.gpus:
        return
    sick = data.draw(st.sampled_from(inv.gpus)).uuid
    marked = p.with_health(frozenset({sick}))
    for before, after in zip(p.resources, marked.resources, strict=True):
        for d0, d1 in zip(before.devices, after.devices, strict=True):
            assert d1.healthy is (sick not in d0.gpu_uuids)
