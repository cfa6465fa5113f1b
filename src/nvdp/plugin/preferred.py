"""GetPreferredAllocation: which of the kubelet's candidate devices a container should get.

Whole GPUs: the best-connected set (most NVLinks, then the closest PCIe path), scored per pair the way
NVIDIA's gpuallocator does. The pair scores come from the inventory once, when the allocator is built,
instead of from NVML on every call (NVIDIA #774: 16-30 s per call on 8-GPU nodes). GPUs the inventory
could not read, and unhealthy devices, never break the answer (NVIDIA #2038): they are picked last,
only when nothing else is left.

Replicas (time-slicing, MPS) and MIG devices: spread over the physical devices (`distributed`) or fill
the busiest first (`packed`), where a device's load is its replicas already handed out (its total
minus the ones still available) plus those picked in this call.

Pure and deterministic: the same request gets the same answer.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterator, Sequence

from msgspec import Struct

from nvdp.config.model import AllocationPolicy
from nvdp.inventory.model import Inventory
from nvdp.plan.model import PlannedResource
from nvdp.plugin.allocate import shown_ids

# gpuallocator's pair scores by NVML topology level (see nvdp.inventory.model.TOPOLOGY_LEVELS).
PCIE_SCORES: dict[int, int] = {
    0: 60,  # same board
    10: 50,  # single PCIe switch
    20: 40,  # multiple PCIe switches
    30: 30,  # same host bridge
    40: 20,  # same NUMA node
    50: 10,  # across NUMA nodes
}
NVLINK_SCORE = 100  # per active link
# Try every candidate set while that costs at most this many pair scores; search greedily above it.
EXHAUSTIVE_LIMIT = 20000


def pair_score(nvlinks: int, pcie_level: int) -> int:
    return NVLINK_SCORE * nvlinks + PCIE_SCORES.get(pcie_level, 0)


class _Candidate(Struct, frozen=True):
    id: str
    order: int  # position in the plan, for deterministic tie-breaks
    group: str  # the device replicas share (base_id)
    gpu: int | None  # GPU index for topology; None when the inventory does not know it
    usable: bool  # healthy and known
    rank: int  # usable ones first, each part in plan order: the order replicas are handed out in


_UNUSABLE = 1 << 40  # added to `order` for the rank of an unusable candidate
_BY_RANK = operator.attrgetter("rank")
_BY_GROUP = operator.attrgetter("group")


class PreferredAllocator:
    """Answers GetPreferredAllocation for one resource; build a new one when the plan changes."""

    def __init__(
        self, resource: PlannedResource, inventory: Inventory, policy: AllocationPolicy = "distributed"
    ) -> None:
        self.resource = resource
        self.policy = policy
        known_gpus = {g.index for g in inventory.gpus}
        self._whole_gpus = all(d.replica is None and d.mig is None for d in resource.devices)
        self._devices: dict[str, _Candidate] = {}
        self._group_totals: dict[str, int] = {}
        for order, device in enumerate(resource.devices):
            gpu = device.gpu_indices[0] if len(device.gpu_indices) == 1 else None
            if gpu is not None and gpu not in known_gpus:
                gpu = None
            usable = device.healthy and gpu is not None
            self._devices[device.id] = _Candidate(
                id=device.id,
                order=order,
                group=device.base_id,
                gpu=gpu,
                usable=usable,
                rank=order if usable else order + _UNUSABLE,
            )
            self._group_totals[device.base_id] = self._group_totals.get(device.base_id, 0) + 1
        # Per group (the device replicas share), its candidates in rank order and its IDs: a request
        # is matched against these rather than turned into candidates ID by ID.
        members: dict[str, list[_Candidate]] = {}
        for candidate in self._devices.values():
            members.setdefault(candidate.group, []).append(candidate)
        self._ranked = {g: sorted(m, key=_BY_RANK) for g, m in members.items()}
        self._group_ids = {g: frozenset(c.id for c in m) for g, m in members.items()}
        # Every pair's score, computed once: from the link record, else from NUMA placement (same-CPU vs
        # cross-CPU), else 0. Keyed by GPU index; the search only looks values up.
        numa = {g.index: g.numa_node for g in inventory.gpus if g.numa_node is not None}
        linked = {
            (min(lk.a, lk.b), max(lk.a, lk.b)): pair_score(lk.nvlinks, lk.pcie_level)
            for lk in inventory.links
        }
        self._scores: dict[int, dict[int, int]] = {a: {} for a in known_gpus}
        for a, b in itertools.permutations(sorted(known_gpus), 2):
            score = linked.get((min(a, b), max(a, b)))
            if score is None and a in numa and b in numa:
                score = PCIE_SCORES[40] if numa[a] == numa[b] else PCIE_SCORES[50]
            self._scores[a][b] = score or 0

    # -- public -----------------------------------------------------------------------------------------

    def select(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """Pick `size` IDs from `available`, including all of `must_include`."""
        name = self.resource.name
        available_set = set(available)
        if len(available_set) != len(available):  # the kubelet sends none; repeats count once
            available = list(dict.fromkeys(available))
        must = list(dict.fromkeys(must_include))
        if size <= 0:
            raise ValueError(f"{name}: allocation size must be at least 1, got {size}")
        if size > len(available):
            raise ValueError(f"{name}: cannot pick {size} devices from {len(available)} available")
        # Sets built once: a request may name tens of thousands of replicas.
        must_set = set(must)
        missing = [i for i in must if i not in available_set]
        if missing:
            raise ValueError(
                f"{name}: must-include devices {shown_ids(missing)} are not among the available devices"
            )
        if len(must) > size:
            raise ValueError(f"{name}: {len(must)} must-include devices do not fit an allocation of {size}")
        needed = size - len(must)
        if needed == 0:
            return must
        required = [self._candidate(i) for i in must]
        if self._whole_gpus:
            known = self._devices
            rest = [known.get(i) or self._candidate(i) for i in available if i not in must_set]
            picked = self._select_connected(required, rest, needed)
        else:
            picked = self._select_by_policy(required, available, available_set, must_set, needed)
        return must + [c.id for c in picked]

    # -- internals --------------------------------------------------------------------------------------

    def _candidate(self, device_id: str) -> _Candidate:
        known = self._devices.get(device_id)
        if known is not None:
            return known
        # Not in this plan (an update raced the request): usable only as a last resort.
        order = len(self._devices)
        return _Candidate(id=device_id, order=order, group=device_id, gpu=None, usable=False,
                          rank=order + _UNUSABLE)

    def _score(self, a: _Candidate, b: _Candidate) -> int:
        if a.gpu is None or b.gpu is None:
            return 0
        return self._scores[a.gpu].get(b.gpu, 0)

    def _set_score(self, members: Sequence[_Candidate]) -> int:
        return sum(self._score(a, b) for a, b in itertools.combinations(members, 2))

    def _select_connected(
        self, required: list[_Candidate], rest: list[_Candidate], needed: int
    ) -> list[_Candidate]:
        usable = sorted((c for c in rest if c.usable), key=lambda c: c.order)
        fallback = sorted((c for c in rest if not c.usable), key=lambda c: c.order)
        take = min(needed, len(usable))
        if take == 0:
            chosen: list[_Candidate] = []
        elif math.comb(len(usable), take) * math.comb(len(required) + take, 2) <= EXHAUSTIVE_LIMIT:
            chosen = self._best_exhaustive(required, usable, take)
        else:
            chosen = self._best_greedy(required, usable, take)
        chosen = sorted(chosen, key=lambda c: c.order)
        return chosen + fallback[: needed - take]

    def _best_exhaustive(
        self, required: list[_Candidate], usable: list[_Candidate], take: int
    ) -> list[_Candidate]:
        best: tuple[_Candidate, ...] = ()
        best_score = -1
        # combinations() yields sets in plan order, so the first best set is the lowest-numbered one.
        for combo in itertools.combinations(usable, take):
            score = self._set_score([*required, *combo])
            if score > best_score:
                best, best_score = combo, score
        return list(best)

    def _grow(self, start: list[_Candidate], pool: list[_Candidate], size: int) -> list[_Candidate]:
        members = list(start)
        remaining = [c for c in pool if c not in members]
        while len(members) < size and remaining:
            gains = [sum(self._score(c, m) for m in members) for c in remaining]
            best = max(range(len(remaining)), key=lambda k: (gains[k], -remaining[k].order))
            members.append(remaining.pop(best))
        return members

    def _improve(self, fixed: int, members: list[_Candidate], pool: list[_Candidate]) -> list[_Candidate]:
        """Swap single members for outsiders while that raises the set's score (members[:fixed] stay).

        A swap's gain is computed from the two devices' links to the rest, so one pass is O(size * pool).
        """
        members = list(members)
        improved = True
        while improved:
            improved = False
            outside = [c for c in pool if c not in members]
            for k in range(fixed, len(members)):
                others = members[:k] + members[k + 1 :]
                current = sum(self._score(members[k], o) for o in others)
                gains = [sum(self._score(c, o) for o in others) - current for c in outside]
                best = max(range(len(outside)), key=lambda j: (gains[j], -outside[j].order), default=None)
                if best is not None and gains[best] > 0:
                    members[k], outside[best] = outside[best], members[k]
                    improved = True
        return members

    def _best_greedy(
        self, required: list[_Candidate], usable: list[_Candidate], take: int
    ) -> list[_Candidate]:
        size = len(required) + take
        # Without must-include devices, every candidate seeds one greedy run; keep the best result.
        seeds = [required] if required else [[c] for c in usable]
        best: list[_Candidate] = []
        best_score = -1
        for seed in seeds:
            grown = self._improve(len(required), self._grow(seed, usable, size), usable)
            score = self._set_score(grown)
            if score > best_score:
                best, best_score = grown, score
        return best[len(required) :]

    def _select_by_policy(
        self,
        required: list[_Candidate],
        available: Sequence[str],
        available_set: set[str],
        must_set: set[str],
        needed: int,
    ) -> list[_Candidate]:
        # A request may name tens of thousands of replicas and the answer needs a few: the groups are
        # counted by set intersections in C, and each group's candidates are walked in rank order
        # only as far as picks reach. IDs not in the plan (an update raced the request) are each a
        # group of their own, after the planned ones, in request order - or join the planned group
        # they name (a GPU's UUID from a plan without replicas).
        still_free: dict[str, int] = {}
        matched = 0
        for group, ids in self._group_ids.items():
            count = len(ids & available_set)
            if count:
                still_free[group] = count
                matched += count
        # The groups partition the planned IDs, so the counts tell whether any ID is not planned.
        known = self._devices
        unknown = [] if matched == len(available_set) else [i for i in available if i not in known]
        for device_id in unknown:
            still_free[device_id] = still_free.get(device_id, 0) + 1
        handed_out = {g: self._group_totals.get(g, n) - n for g, n in still_free.items()}
        picks: dict[str, int] = dict(Counter(map(_BY_GROUP, required)))

        rest = available_set - must_set if must_set else available_set
        queues: dict[str, Iterator[_Candidate]] = {
            g: (c for c in ranked if c.id in rest) for g, ranked in self._ranked.items() if g in still_free
        }
        for device_id in unknown:
            if device_id in must_set:
                continue
            late = iter([self._candidate(device_id)])
            queue = queues.get(device_id)
            queues[device_id] = late if queue is None else itertools.chain(queue, late)
        heads = {g: head for g, queue in queues.items() if (head := next(queue, None)) is not None}
        sign = 1 if self.policy == "distributed" else -1

        def entry(position: int, group: str, first_order: int) -> tuple[bool, int, int, int, int, str]:
            # Usable heads first, then the least (distributed) or most (packed) loaded group, then
            # the one with fewer picks in this call, then plan order; position breaks the last ties.
            taken = picks.get(group, 0)
            load = handed_out.get(group, 0) + taken
            return (not heads[group].usable, sign * load, taken, first_order, position, group)

        # A pick changes only its own group's place, so a heap replaces a scan of every group per pick.
        heap = [entry(n, g, head.order) for n, (g, head) in enumerate(heads.items())]
        heapq.heapify(heap)
        picked: list[_Candidate] = []
        while len(picked) < needed:
            *_, first_order, position, group = heapq.heappop(heap)
            picked.append(heads[group])
            picks[group] = picks.get(group, 0) + 1
            following = next(queues[group], None)
            if following is not None:
                heads[group] = following
                heapq.heappush(heap, entry(position, group, first_order))
        return picked
