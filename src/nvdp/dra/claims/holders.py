"""Which prepared claims hold what a claim asks for, by what each device occupies on its GPU.

The allocation is not trusted to keep devices apart: a forged claim status, or an allocation raced
with a slice update, can name a MIG placement on a GPU that another claim holds whole. So a device is
compared with every other prepared claim's devices by what it occupies, not by name:

- a whole GPU occupies all of it (every MIG device and placement on it too);
- a MIG placement (dynamic MIG) its memory slices;
- a MIG device of a fixed layout itself (its UUID), and the whole GPU it is on.

Two devices that occupy the same thing conflict, unless they are one device the scheduler shared
(replicas of a shared GPU, each claim with a share ID); a device allocated for admin access (KEP-5018)
holds nothing and is left out on both sides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from msgspec import Struct

from nvdp.dra.claims.records import ClaimEntry
from nvdp.dra.pool.devices import DraDevice


class Occupied(Struct, frozen=True):
    """What a device occupies on its GPU: the whole GPU, its memory slices, or itself."""

    gpu_uuid: str
    whole: bool
    slices: frozenset[int] = frozenset()
    uuid: str = ""

    def overlaps(self, other: Occupied) -> bool:
        if self.gpu_uuid != other.gpu_uuid:
            return False
        if self.whole or other.whole:
            return True
        if self.slices and other.slices:
            return bool(self.slices & other.slices)
        return bool(self.uuid) and self.uuid == other.uuid


def occupied(device: DraDevice) -> Occupied:
    if device.placement is not None:
        p = device.placement
        return Occupied(device.gpu_uuid, whole=False, slices=frozenset(range(p.start, p.start + p.size)))
    return Occupied(device.gpu_uuid, whole=device.kind == "gpu", uuid=device.uuid)


class Held(Struct, frozen=True):
    """A device of another prepared claim that a requested device overlaps."""

    device: str  # the requested device
    held: str  # the prepared claim's device
    claim_uid: str


def overlapping(claim_uid: str, wanted: Iterable[tuple[str, bool]], devices: Mapping[str, DraDevice],
                prepared: Mapping[str, ClaimEntry]) -> list[Held]:
    """The devices of other prepared claims that `wanted` (device name, shared with a share ID) overlap.
    A device no longer on the node is compared by name only (its GPU is not known)."""
    found: list[Held] = []
    for name, shared in wanted:
        mine = devices.get(name)
        for uid, entry in prepared.items():
            if uid == claim_uid:
                continue
            for theirs in entry.devices:
                if theirs.admin_access or (shared and theirs.device == name):
                    continue
                other = devices.get(theirs.device)
                if theirs.device == name or (mine is not None and other is not None
                                             and occupied(mine).overlaps(occupied(other))):
                    found.append(Held(device=name, held=theirs.device, claim_uid=uid))
    return found


def holders_on(gpus: Iterable[str], prepared: Mapping[str, ClaimEntry], devices: Mapping[str, DraDevice],
               but: str) -> list[str]:
    """The prepared claims (by UID) other than `but` holding a device on one of `gpus` (admin-access
    devices hold nothing)."""
    on = set(gpus)
    return [uid for uid, entry in prepared.items() if uid != but and any(
        not d.admin_access and d.device in devices and devices[d.device].gpu_uuid in on
        for d in entry.devices)]
