"""Dynamic MIG (flags.migStrategy: dynamic): every MIG device a GPU could make, as partitionable devices.

Each MIG-capable GPU gets one counter set (KEP-4815: a ResourceSlice's sharedCounters) holding what
NVML's placement rules count, and one device per possible placement of every GPU-instance profile NVML
reports for it (`Gpu.mig_profiles`), consuming its placement's counters. The scheduler then never
allocates two devices whose counters together exceed the set: two placements that overlap, more
compute slices than the GPU has, or more instances of a profile than `instanceCount` allows (one
`1g.10gb+me` at a time on an H100). The counters are exactly NVML's rules, so an allocation the
scheduler makes is one NVML can create:

- `memory-slice-<i>` (1 each): the placement's memory slices, start .. start+size-1;
- `compute-slices`: the profile's compute slices, out of the largest profile's (7 on A100 and H100);
- `profile-<id>-instances`: only for a profile that allows fewer instances than it has disjoint
  placements (the `+me` profiles), its instance count.

Where the GPU can also serve whole (`whole_gpu_published`), the whole GPU is one more device that
consumes every counter of the set, so a claim gets either the whole GPU or MIG slices, never both.
Devices are named and attributed as static MIG devices (`nvdp.dra.pool.devices`), without `uuid`: the
MIG device has none until a claim's prepare makes it (its UUID is then in the claim's status).

`flags.migDynamicProfiles` narrows the placements published to the profiles it names ("1g.10gb") and
single placements ("3g.40gb@4": the one starting at memory slice 4); the counters stay the GPU's, since
they describe what the GPU holds, not what is offered. `offer_problem` refuses names the node's GPUs
do not have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from msgspec.structs import replace

from nvdp.dra.pool.devices import (
    MIB,
    Attributes,
    Capacity,
    CounterSet,
    DraDevice,
    Placement,
    common_attributes,
    gpu_device,
)
from nvdp.dra.pool.names import placement_device_name
from nvdp.inventory.model import Gpu, Inventory, MigDevice, MigProfile

MEMORY_SLICES = 8
COMPUTE_SLICES = "compute-slices"
# Architectures whose MIG mode switches without a GPU reset. NVIDIA's MIG user guide (deployment
# considerations): "Setting MIG mode on the A100/A30 requires a GPU reset"; Hopper and Blackwell
# switch at once. An architecture not named here is not switched by nvdp.
_SWITCH_WITHOUT_RESET = frozenset({"Hopper", "Blackwell"})


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-mig"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


def instances_counter(profile: MigProfile) -> str:
    return f"profile-{profile.gi_profile_id}-instances"


def switches_without_reset(gpu: Gpu) -> bool:
    """Whether nvdp may switch the GPU's MIG mode itself: Hopper and later switch without a GPU reset;
    Ampere needs one (and an unknown architecture is not guessed at)."""
    return gpu.architecture in _SWITCH_WITHOUT_RESET


def partitions_published(gpu: Gpu) -> bool:
    """Whether the GPU's MIG placements are published: MIG mode on, or off on a GPU that nvdp can
    switch to MIG mode at prepare without a reset."""
    return bool(gpu.mig_capable and gpu.mig_profiles) and (gpu.mig_enabled or switches_without_reset(gpu))


def whole_gpu_published(gpu: Gpu) -> bool:
    """Whether the whole GPU is published: MIG mode off, or on a GPU nvdp can switch back without a
    reset (it switches MIG off at prepare once no MIG device is left on it)."""
    return not gpu.mig_enabled or switches_without_reset(gpu)


def _limited(profile: MigProfile) -> bool:
    """A profile with fewer instances allowed than it has placements that do not overlap."""
    ends: list[int] = []
    for start, size in sorted(profile.placements):
        if not ends or start >= ends[-1]:
            ends.append(start + size)
    return profile.instances < len(ends)


def gpu_counters(gpu: Gpu) -> CounterSet:
    counters: dict[str, int] = {memory_slice_counter(i): 1 for i in range(MEMORY_SLICES)}
    counters[COMPUTE_SLICES] = max((p.slices for p in gpu.mig_profiles), default=0)
    for profile in gpu.mig_profiles:
        if _limited(profile):
            counters[instances_counter(profile)] = profile.instances
    return CounterSet(name=counter_set_name(gpu), counters=counters)


def placement_counters(profile: MigProfile, start: int, size: int) -> dict[str, int]:
    used = {memory_slice_counter(i): 1 for i in range(start, start + size)}
    used[COMPUTE_SLICES] = profile.slices
    if _limited(profile):
        used[instances_counter(profile)] = 1
    return used


def occupied(instances: Iterable[MigDevice]) -> frozenset[int]:
    """The memory slices live GPU instances take."""
    taken: set[int] = set()
    for mig in instances:
        if mig.placement_start is not None and mig.placement_size is not None:
            taken.update(range(mig.placement_start, mig.placement_start + mig.placement_size))
    return frozenset(taken)


class Offers:
    """What `flags.migDynamicProfiles` offers: whole profiles and single placements (None: everything)."""

    def __init__(self, entries: Sequence[str] | None) -> None:
        self.entries = tuple(entries) if entries is not None else None
        self.profiles: set[str] = set()
        self.placements: set[tuple[str, int]] = set()
        for entry in self.entries or ():
            name, at, start = entry.partition("@")
            if at:
                self.placements.add((name, int(start)))
            else:
                self.profiles.add(name)

    def __bool__(self) -> bool:
        return self.entries is not None

    def offers(self, profile: MigProfile, start: int) -> bool:
        return (self.entries is None or profile.name in self.profiles
                or (profile.name, start) in self.placements)

    def describe(self) -> str:
        return ", ".join(self.entries or ())


def _close(word: str, options: Iterable[str]) -> str | None:
    import difflib  # only a refused name needs it

    lowered = {option.lower(): option for option in sorted(options)}
    found = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[found[0]] if found else None


def offer_problem(inventory: Inventory, offers: Offers) -> str | None:
    """Why `offers` names something no MIG-capable GPU of the node has (None: every name is there, or
    the node has no GPU with MIG profiles to check against), with the valid names."""
    gpus = [gpu for gpu in inventory.gpus if gpu.mig_capable and gpu.mig_profiles]
    if not offers or not gpus:
        return None
    starts: dict[str, set[int]] = {}
    for gpu in gpus:
        for profile in gpu.mig_profiles:
            starts.setdefault(profile.name, set()).update(start for start, _ in profile.placements)
    valid = ", ".join(sorted(starts))
    problems: list[str] = []
    for name in sorted(offers.profiles | {name for name, _ in offers.placements}):
        if name not in starts:
            close = _close(name, starts)
            hint = f" (did you mean {close}?)" if close else ""
            problems.append(f"{name} is not a MIG profile of this node's GPUs{hint}")
    for name, start in sorted(offers.placements):
        if name in starts and start not in starts[name]:
            places = ", ".join(str(s) for s in sorted(starts[name]))
            problems.append(f"{name}@{start}: no {name} placement starts at memory slice {start} (they start "
                            f"at {places})")
    if not problems:
        return None
    return (f"flags.migDynamicProfiles: {'; '.join(problems)}; the profiles of this node's MIG-capable GPUs "
            f"are {valid}")


def dynamic_devices(inventory: Inventory, foreign: Mapping[str, Sequence[MigDevice]] | None = None,
                    offers: Offers | None = None) -> tuple[DraDevice, ...]:
    """The devices of a node under migStrategy dynamic, GPUs in minor order; each device that consumes
    counters carries its GPU's counter set.

    `foreign`: by GPU UUID, the MIG devices that exist and that nvdp did not make (made with
    nvidia-smi or mig-parted): their placements, and every placement overlapping them, are left out,
    and so is that GPU's whole-GPU device; they are never destroyed. A GPU that is not MIG capable
    is published whole, as under the other strategies. `offers` (flags.migDynamicProfiles): only the
    placements it names are published; the whole GPU and the counters are as without it.
    """
    devices: list[DraDevice] = []
    foreign = foreign or {}
    offers = offers or Offers(None)
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        common = common_attributes(gpu, inventory)
        if not (gpu.mig_capable and gpu.mig_profiles):
            devices.append(gpu_device(gpu, common))
            continue
        counters = gpu_counters(gpu)
        taken = occupied(foreign.get(gpu.uuid, ()))
        if whole_gpu_published(gpu) and not taken:
            whole = gpu_device(gpu, common)
            devices.append(replace(whole, counter_set=counters, consumes=dict(counters.counters)))
        if not partitions_published(gpu):
            continue
        for profile in gpu.mig_profiles:
            for start, size in profile.placements:
                if taken.intersection(range(start, start + size)) or not offers.offers(profile, start):
                    continue
                devices.append(_partition(gpu, profile, start, size, common, counters))
    return tuple(devices)


def _partition(gpu: Gpu, profile: MigProfile, start: int, size: int, common: Attributes,
               counter_set: CounterSet) -> DraDevice:
    attrs: Attributes = {
        "type": {"string": "mig"},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": profile.name},
        **common,
    }
    engines = {
        "multiprocessors": profile.multiprocessors,
        "copyEngines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpegEngines": profile.jpeg_engines,
        "ofaEngines": profile.ofa_engines,
        "memory": profile.memory_mib * MIB,
    }
    capacity: Capacity = {key: {"value": str(value)} for key, value in engines.items()}
    for i in range(start, start + size):
        capacity[f"memorySlice{i}"] = {"value": "1"}
    return DraDevice(
        name=placement_device_name(gpu, profile.name, profile.gi_profile_id, start),
        kind="mig",
        uuid="",
        gpu_uuid=gpu.uuid,
        attributes=attrs,
        capacity=capacity,
        placement=Placement(profile=profile.name, gi_profile_id=profile.gi_profile_id, start=start,
                            size=size),
        counter_set=counter_set,
        consumes=placement_counters(profile, start, size),
    )
