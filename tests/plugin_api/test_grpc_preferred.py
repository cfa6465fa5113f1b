"""GetPreferredAllocation: connected GPU sets for whole GPUs, policies for replicas."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest
from grpc_factories import gpu_uuid, make_inventory, replicated_resource, whole_gpu_resource
from msgspec.structs import replace

from nvdp.inventory.model import Inventory, Link, LostGpu
from nvdp.plan.model import PlannedResource
from nvdp.plugin.preferred import EXHAUSTIVE_LIMIT, PreferredAllocator, pair_score

SINGLE_SWITCH, HOSTBRIDGE, CROSS_NUMA = 10, 30, 50


def gpus(*indices: int) -> list[str]:
    return [gpu_uuid(i) for i in indices]


def links(
    count: int, nvlinked: dict[tuple[int, int], int], pcie: dict[tuple[int, int], int]
) -> tuple[Link, ...]:
    return tuple(
        Link(a, b, nvlinks=nvlinked.get((a, b), 0), pcie_level=pcie.get((a, b), CROSS_NUMA))
        for a, b in itertools.combinations(range(count), 2)
    )


def test_pair_scores_follow_gpuallocator() -> None:
    assert pair_score(0, 0) == 60
    assert pair_score(0, 10) == 50
    assert pair_score(0, 20) == 40
    assert pair_score(0, 30) == 30
    assert pair_score(0, 40) == 20
    assert pair_score(0, 50) == 10
    assert pair_score(2, 50) == 210


def test_nvlink_pair_beats_a_pcie_switch_pair() -> None:
    # 0-1 share a PCIe switch; 0-2 and 1-3 are joined by NVLink.
    inventory = make_inventory(
        4, links(4, {(0, 2): 2, (1, 3): 2}, {(0, 1): SINGLE_SWITCH, (2, 3): SINGLE_SWITCH})
    )
    allocator = PreferredAllocator(whole_gpu_resource(inventory), inventory)
    assert allocator.select(gpus(0, 1, 2, 3), [], 2) == gpus(0, 2)
    assert allocator.select(gpus(0, 1, 2, 3), gpus(1), 2) == gpus(1, 3)
    # Without NVLink partners left, the closer PCIe path wins.
    assert allocator.select(gpus(0, 1, 3), gpus(0), 2) == gpus(0, 1)


def test_more_nvlinks_win() -> None:
    inventory = make_inventory(3, links(3, {(0, 1): 1, (0, 2): 4}, {}))
    allocator = PreferredAllocator(whole_gpu_resource(inventory), inventory)
    assert allocator.select(gpus(0, 1, 2), gpus(0), 2) == gpus(0, 2)


def _two_islands(count: int) -> Inventory:
    half = count // 2
    nvlinked = {(a, b): 2 for a, b in itertools.combinations(range(count), 2) if (a < half) == (b < half)}
    return make_inventory(count, links(count, nvlinked, {}))


def test_greedy_search_keeps_nvlink_islands_together() -> None:
    inventory = _two_islands(16)
    allocator = PreferredAllocator(whole_gpu_resource(inventory), inventory)
    everything = gpus(*range(16))
    assert math.comb(16, 8) * math.comb(8, 2) > EXHAUSTIVE_LIMIT  # the greedy path runs
    assert allocator.select(everything, [], 8) == gpus(*range(8))
    assert allocator.select(everything, gpus(9), 8) == [gpu_uuid(9), *gpus(8, 10, 11, 12, 13, 14, 15)]
    # Island 0 partly taken: the rest of it is still the best-connected set of 4.
    assert allocator.select(gpus(*range(3, 16)), [], 5) == gpus(3, 4, 5, 6, 7)


def test_answer_has_the_requested_size_for_every_size() -> None:
    inventory = _two_islands(8)
    allocator = PreferredAllocator(whole_gpu_resource(inventory), inventory)
    for size in range(1, 9):
        picked = allocator.select(gpus(*range(8)), gpus(7), size)
        assert len(picked) == size == len(set(picked))
        assert picked[0] == gpu_uuid(7)


def test_lost_and_unhealthy_gpus_do_not_break_the_answer() -> None:
    inventory = make_inventory(4, links(4, {(0, 1): 2, (2, 3): 2}, {}))
    resource = whole_gpu_resource(inventory)
    # GPU 3 fell off the bus: the inventory lost it but its ID is still offered.
    lost = replace(inventory, gpus=inventory.gpus[:3], lost=(LostGpu(3, gpu_uuid(3), "GPU is lost"),))
    sick = replace(resource, devices=(*resource.devices[:2], replace(resource.devices[2], healthy=False)))
    allocator = PreferredAllocator(sick, lost)
    assert allocator.select(gpus(0, 1, 2, 3), [], 2) == gpus(0, 1)
    # Only the lost and the unhealthy GPU are left besides 0: still an answer, usable first.
    assert allocator.select(gpus(0, 2, 3), [], 2) == gpus(0, 2)
    assert allocator.select(gpus(2, 3), [], 2) == gpus(2, 3)


def test_unknown_ids_are_used_only_as_a_last_resort() -> None:
    inventory = make_inventory(2)
    allocator = PreferredAllocator(whole_gpu_resource(inventory), inventory)
    assert allocator.select(["GPU-new", *gpus(1, 0)], [], 2) == gpus(0, 1)
    assert allocator.select(["GPU-new", *gpus(1)], [], 2) == [gpu_uuid(1), "GPU-new"]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (gpus(0), [], 2, "nvidia.com/gpu: cannot pick 2 devices from 1 available"),
        (gpus(0, 1), gpus(2), 1, r"nvidia.com/gpu: must-include devices GPU-00000002-[^ ]* are not among"),
        (gpus(0, 1), gpus(0, 1), 1, "nvidia.com/gpu: 2 must-include devices do not fit an allocation of 1"),
        (gpus(0), [], 0, "nvidia.com/gpu: allocation size must be at least 1, got 0"),
    ],
)
def test_bad_requests_name_the_problem(
    available: list[str], must: list[str], size: int, message: str
) -> None:
    inventory = make_inventory(3)
    allocator = PreferredAllocator(whole_gpu_resource(inventory), inventory)
    with pytest.raises(ValueError, match=f"^{message}"):
        allocator.select(available, must, size)


def replicas(gpu: int, *numbers: int) -> list[str]:
    return [f"{gpu_uuid(gpu)}::{n}" for n in numbers]


def test_distributed_spreads_over_gpus() -> None:
    inventory = make_inventory(2)
    allocator = PreferredAllocator(replicated_resource(inventory, 4), inventory, "distributed")
    everything = replicas(0, 0, 1, 2, 3) + replicas(1, 0, 1, 2, 3)
    assert allocator.select(everything, [], 2) == [*replicas(0, 0), *replicas(1, 0)]
    # GPU 0 already serves two containers (::0 and ::1 are gone): GPU 1 comes first.
    assert allocator.select(replicas(0, 2, 3) + replicas(1, 0, 1, 2, 3), [], 3) == [
        *replicas(1, 0, 1),
        *replicas(0, 2),
    ]


def test_packed_fills_the_busiest_gpu_first() -> None:
    inventory = make_inventory(2)
    allocator = PreferredAllocator(replicated_resource(inventory, 4), inventory, "packed")
    assert allocator.select(replicas(0, 2, 3) + replicas(1, 0, 1, 2, 3), [], 3) == [
        *replicas(0, 2, 3),
        *replicas(1, 0),
    ]
    # Nothing handed out yet: packing still keeps one call on one GPU.
    everything = replicas(0, 0, 1, 2, 3) + replicas(1, 0, 1, 2, 3)
    assert allocator.select(everything, [], 2) == replicas(0, 0, 1)


def test_replica_must_include_counts_towards_its_gpu() -> None:
    inventory = make_inventory(2)
    allocator = PreferredAllocator(replicated_resource(inventory, 2), inventory, "distributed")
    everything = replicas(0, 0, 1) + replicas(1, 0, 1)
    assert allocator.select(everything, replicas(0, 1), 2) == [*replicas(0, 1), *replicas(1, 0)]


def test_unhealthy_replicas_are_picked_last() -> None:
    inventory = make_inventory(2)
    resource = replicated_resource(inventory, 2)
    sick = replace(
        resource, devices=tuple(replace(d, healthy=d.gpu_indices != (0,)) for d in resource.devices)
    )
    allocator = PreferredAllocator(sick, inventory, "distributed")
    everything = replicas(0, 0, 1) + replicas(1, 0, 1)
    assert allocator.select(everything, [], 3) == [*replicas(1, 0, 1), *replicas(0, 0)]


def test_large_replica_sets_are_answered() -> None:
    inventory = make_inventory(8)
    allocator = PreferredAllocator(replicated_resource(inventory, 128), inventory, "distributed")
    everything = [f"{gpu_uuid(g)}::{r}" for g in range(8) for r in range(128)]
    picked = allocator.select(everything, [], 16)
    assert sorted(p.split("::")[0] for p in picked) == sorted(gpus(*range(8)) * 2)


def _policy_reference(
    resource: PlannedResource, available: list[str], must: list[str], size: int, policy: str
) -> list[str]:
    """The replica policy written plainly, one Python step at a time, to check the allocator against."""
    planned = {d.id: (n, d) for n, d in enumerate(resource.devices)}
    totals = Counter(d.base_id for d in resource.devices)

    def group(device_id: str) -> str:
        return planned[device_id][1].base_id if device_id in planned else device_id

    def rank(device_id: str) -> tuple[bool, int]:  # usable first, then plan order; unplanned ones last
        order, device = planned.get(device_id, (len(planned), None))
        return (device is None or not device.healthy, order)

    available = list(dict.fromkeys(available))
    free = Counter(group(i) for i in available)
    handed_out = {g: totals.get(g, n) - n for g, n in free.items()}
    picks = Counter(group(i) for i in must)
    queues: dict[str, list[str]] = {}
    for device_id in sorted((i for i in available if i not in must), key=rank):
        queues.setdefault(group(device_id), []).append(device_id)
    first = {g: rank(q[0])[1] for g, q in queues.items()}
    sign = 1 if policy == "distributed" else -1
    picked: list[str] = []
    while len(must) + len(picked) < size:
        best = min((g for g, q in queues.items() if q), key=lambda g: (
            rank(queues[g][0])[0], sign * (handed_out.get(g, 0) + picks[g]), picks[g], first[g]))
        picked.append(queues[best].pop(0))
        picks[best] += 1
    return [*must, *picked]


@pytest.mark.parametrize("policy", ["distributed", "packed"])
def test_replica_answers_match_the_policy_written_plainly(policy: str) -> None:
    """Random requests, some with unhealthy GPUs, IDs no longer planned, and a GPU's own UUID."""
    rng = random.Random(policy)
    inventory = make_inventory(4)
    for trial in range(150):
        resource = replicated_resource(inventory, rng.choice([2, 3, 16]))
        if trial % 3 == 0:
            sick = rng.choice(range(4))
            resource = replace(resource, devices=tuple(
                replace(d, healthy=d.gpu_indices != (sick,)) for d in resource.devices))
        ids = [d.id for d in resource.devices]
        available = rng.sample(ids, rng.randint(1, len(ids)))
        if trial % 4 == 1:
            gone = [f"GPU-gone-{n}" for n in range(rng.randint(1, 3))]
            available += [*gone, gpu_uuid(rng.choice(range(4)))]  # a GPU UUID from a plan without replicas
            rng.shuffle(available)
        size = rng.randint(1, min(len(available), 10))
        must = rng.sample(available, rng.randint(0, min(size, 3)))
        allocator = PreferredAllocator(resource, inventory, policy)  # type: ignore[arg-type]
        assert allocator.select(available, must, size) == _policy_reference(
            resource, available, must, size, policy), (trial, available, must, size)
