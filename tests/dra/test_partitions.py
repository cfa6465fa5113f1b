"""Dynamic MIG devices: one per possible placement, counters that allow exactly what NVML can make."""

from __future__ import annotations

from collections import Counter
from typing import Any

import kubernetes_validate
import pytest
from msgspec.structs import replace

from nvdp.config.loader import load_config
from nvdp.dra.pool.contents import pool_devices, pool_warnings
from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.partitions import (
    COMPUTE_SLICES,
    dynamic_devices,
    partitions_published,
    whole_gpu_published,
)
from nvdp.dra.pool.slices import desired_slices
from nvdp.inventory.model import Gpu, Inventory, MigDevice, MigProfile

# What a real H100 80GB HBM3 answers (docs/mig-nvml-h100.md): name, index, id, slices, instances,
# SMs, memory MiB, CE, NVDEC, NVJPG, OFA, placements.
H100 = (
    ("1g.10gb", 0, 19, 1, 7, 16, 9984, 1, 1, 1, 0, [(i, 1) for i in range(7)]),
    ("2g.20gb", 1, 14, 2, 3, 32, 20096, 2, 2, 2, 0, [(0, 2), (2, 2), (4, 2)]),
    ("3g.40gb", 2, 9, 3, 2, 60, 40448, 3, 3, 3, 0, [(0, 4), (4, 4)]),
    ("4g.40gb", 3, 5, 4, 1, 64, 40448, 4, 4, 4, 0, [(0, 4)]),
    ("7g.80gb", 4, 0, 7, 1, 132, 81152, 8, 7, 7, 1, [(0, 8)]),
    ("1g.10gb+me", 7, 20, 1, 1, 16, 9984, 1, 1, 1, 1, [(i, 1) for i in range(7)]),
    ("1g.20gb", 9, 15, 1, 4, 26, 20096, 1, 1, 1, 0, [(0, 2), (2, 2), (4, 2), (6, 2)]),
)


def h100_profiles() -> tuple[MigProfile, ...]:
    return tuple(
        MigProfile(name=n, profile_index=i, gi_profile_id=gid, slices=s, instances=inst, memory_mib=mem,
                   multiprocessors=sm, copy_engines=ce, decoders=dec, encoders=0, jpeg_engines=jpg,
                   ofa_engines=ofa, placements=tuple(p))
        for n, i, gid, s, inst, sm, mem, ce, dec, jpg, ofa, p in H100
    )  # fmt: skip


def h100(index: int = 0, *, mig_enabled: bool = True, architecture: str = "Hopper",
         mig_devices: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", name="NVIDIA H100 80GB HBM3",
               memory_bytes=81559 << 20, compute_capability=(9, 0), minor=index,
               pci_bus_id=f"00000000:{0x18 + index:02X}:00.0", mig_capable=True, mig_enabled=mig_enabled,
               mig_devices=mig_devices, mig_profiles=h100_profiles(), architecture=architecture,
               brand="Tesla")


def node(*gpus: Gpu) -> Inventory:
    return Inventory(driver_version="580.159.04", cuda_driver_version="13.0", gpus=gpus)


def dynamic_config() -> Any:
    return load_config(None, {}, {"flags.migStrategy": "dynamic", "flags.mode": "dra"})


def test_h100_publishes_every_placement_of_every_profile_as_the_guide_lists() -> None:
    devices = dynamic_devices(node(h100()))
    per_profile = Counter(d.placement.profile for d in devices if d.placement is not None)
    assert per_profile == {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1,
                           "7g.80gb": 1, "1g.10gb+me": 7}
    names = [d.name for d in devices]
    assert "gpu-0-mig-3g40gb-9-4" in names and "gpu-0-mig-1g10gb-me-20-6" in names
    assert names[0] == "gpu-0"  # Hopper switches MIG mode without a reset: the whole GPU too
    assert len(set(names)) == len(names)


def test_partition_is_attributed_as_a_static_mig_device_without_uuid() -> None:
    devices = {d.name: d for d in dynamic_devices(node(h100()))}
    d = devices["gpu-0-mig-3g40gb-9-0"]
    assert d.kind == "mig" and d.uuid == "" and "uuid" not in d.attributes
    assert d.attributes["profile"] == {"string": "3g.40gb"}
    assert d.attributes["parentUUID"] == {"string": h100().uuid}
    assert d.capacity["multiprocessors"] == {"value": "60"}
    assert d.capacity["memory"] == {"value": str(40448 << 20)}
    assert [k for k in d.capacity if k.startswith("memorySlice")] == [f"memorySlice{i}" for i in range(4)]
    assert d.consumes == {"memory-slice-0": 1, "memory-slice-1": 1, "memory-slice-2": 1, "memory-slice-3": 1,
                          COMPUTE_SLICES: 3}


def _fits(chosen: list[DraDevice]) -> bool:
    """What the scheduler allows: the counters the devices consume fit their sets."""
    used: Counter[str] = Counter()
    for d in chosen:
        used.update(d.consumes)
    totals = chosen[0].counter_set.counters if chosen and chosen[0].counter_set else {}
    return all(used[k] <= totals.get(k, 0) for k in used)


def _nvml_allows(chosen: list[DraDevice]) -> bool:
    """NVML's rules, written independently of the counters: a whole GPU only alone; MIG placements
    that do not overlap, at most `instances` of a profile, at most 7 compute slices."""
    if any(d.placement is None for d in chosen):
        return len(chosen) == 1
    slices: list[int] = []
    count: Counter[int] = Counter()
    compute = 0
    profiles = {p.gi_profile_id: p for p in h100_profiles()}
    for d in chosen:
        assert d.placement is not None
        slices += range(d.placement.start, d.placement.start + d.placement.size)
        count[d.placement.gi_profile_id] += 1
        compute += profiles[d.placement.gi_profile_id].slices
    return (len(slices) == len(set(slices)) and compute <= 7
            and all(count[g] <= profiles[g].instances for g in count))


def test_counters_allow_exactly_the_combinations_nvml_can_make() -> None:
    devices = list(dynamic_devices(node(h100())))
    seen = 0

    def extend(chosen: list[DraDevice], start: int) -> None:
        nonlocal seen
        for i in range(start, len(devices)):
            bigger = [*chosen, devices[i]]
            assert _fits(bigger) == _nvml_allows(bigger), [d.name for d in bigger]
            if _fits(bigger):
                seen += 1
                extend(bigger, i + 1)

    extend([], 0)
    assert seen > 1000  # every layout of one H100 was compared, not a handful


def test_mig_mode_and_architecture_decide_what_is_published() -> None:
    assert whole_gpu_published(h100(mig_enabled=False)) and partitions_published(h100(mig_enabled=False))
    ampere_off = replace(h100(mig_enabled=False), architecture="Ampere")
    assert whole_gpu_published(ampere_off) and not partitions_published(ampere_off)
    ampere_on = replace(h100(), architecture="Ampere")
    assert partitions_published(ampere_on) and not whole_gpu_published(ampere_on)
    names = [d.name for d in dynamic_devices(node(ampere_off))]
    assert names == ["gpu-0"]
    (warning,) = pool_warnings(dynamic_config(), node(ampere_off), "dra", default_is="", default_fix="")
    assert "needs a GPU reset" in warning and "nvidia-smi -i 0 -mig 1" in warning


def test_foreign_instances_are_left_out_with_every_placement_overlapping_them() -> None:
    made_elsewhere = MigDevice(uuid="MIG-aaaaaaaa-0000-0000-0000-000000000000", index=0,
                               parent_uuid=h100().uuid, parent_index=0, profile="2g.20gb", gi_id=3, ci_id=0,
                               memory_bytes=20096 << 20,
                               gi_profile_id=14, placement_start=2, placement_size=2)
    gpu = h100(mig_devices=(made_elsewhere,))
    devices = pool_devices(dynamic_config(), node(gpu))
    names = {d.name for d in devices}
    assert "gpu-0" not in names  # the whole GPU would destroy what someone else made
    assert "gpu-0-mig-1g10gb-19-2" not in names and "gpu-0-mig-3g40gb-9-0" not in names
    assert "gpu-0-mig-7g80gb-0-0" not in names
    assert {"gpu-0-mig-1g10gb-19-1", "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-2g20gb-14-4"} <= names
    # an instance the plugin made for a claim keeps its placement published (the claim holds it)
    mine = pool_devices(dynamic_config(), node(gpu), owns=lambda m: m.uuid == made_elsewhere.uuid)
    assert "gpu-0-mig-2g20gb-14-2" in {d.name for d in mine}
    (warning,) = pool_warnings(dynamic_config(), node(gpu), "dra", default_is="", default_fix="")
    assert made_elsewhere.uuid in warning and "never destroyed" in warning


@pytest.mark.parametrize("gpus", [1, 8, 9])
def test_slices_hold_counter_sets_apart_and_validate(gpus: int) -> None:
    inventory = node(*(h100(i) for i in range(gpus)))
    devices = pool_devices(dynamic_config(), inventory)
    slices = desired_slices(node="node-a", node_uid="uid", driver="gpu.nvidia.com", devices=devices)
    for obj in slices:
        kubernetes_validate.validate(obj, "1.36", strict=True)
        spec = obj["spec"]
        assert ("devices" in spec) != ("sharedCounters" in spec)
        assert len(spec.get("devices", [])) <= 64 and len(spec.get("sharedCounters", [])) <= 8
        assert spec["pool"]["resourceSliceCount"] == len(slices)
    sets = [s for obj in slices for s in obj["spec"].get("sharedCounters", [])]
    assert [s["name"] for s in sets] == [f"gpu-{i}-mig" for i in range(gpus)]
    published = [d for obj in slices for d in obj["spec"].get("devices", [])]
    assert len(published) == 26 * gpus
    for d in published:
        (use,) = d["consumesCounters"]
        assert use["counterSet"].startswith(d["name"].split("-mig-")[0] + "-mig")
        assert len(d.get("attributes", {})) + len(d.get("capacity", {})) <= 32
    whole = next(d for d in published if d["name"] == "gpu-0")
    assert whole["consumesCounters"][0]["counters"] == sets[0]["counters"]


def test_the_doctor_says_which_gpus_make_mig_devices_on_demand_and_why_not(tmp_path: Any) -> None:
    from nvdp.doctor.dra_check import DraNode, dynamic_mig

    sockets = str(tmp_path / "reg.sock"), str(tmp_path / "plugin" / "dra.sock")
    plugin = DraNode("gpu.nvidia.com", *sockets, True, "")
    ok = dynamic_mig(node(h100()), plugin)
    assert ok.status == "PASS" and "GPU(s) [0]" in ok.detail
    ampere = replace(h100(mig_enabled=False), architecture="Ampere")
    bad = dynamic_mig(node(ampere), plugin)
    assert bad.status == "FAIL" and "needs a GPU reset" in bad.detail
    assert "nvidia-smi -i 0 -mig 1" in bad.detail
