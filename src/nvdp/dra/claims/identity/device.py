"""What a prepared device is, computed once for both places that tell it (pure).

A monitoring agent joins a GPU's metrics to the claim, and so to the pod, by these: the UUID of the GPU
or MIG device, the MIG device's parent and profile, and for a shared device how it is shared (the
strategy, the scheduler's share, the MPS limits the claim's clients run under). The keys the claim's
status carries are the names NVIDIA's DRA driver publishes in its slices and dcgm-exporter reads from
them (`type`, `uuid`, `parentUUID`, `profile`: internal/pkg/transformation/dra.go); a dynamic MIG
device has no UUID until a prepare makes it, so only the claim's status can tell it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec import Struct

from nvdp.dra.claims.records import ClaimShare, PreparedDevice
from nvdp.dra.pool.devices import Attributes, DraDevice
from nvdp.inventory.model import MigDevice

TIME_SLICING = "TimeSlicing"  # NVIDIA's GpuConfig names for the two ways of sharing
MPS = "MPS"


class DeviceIdentity(Struct, frozen=True, omit_defaults=True):
    """One prepared device of a claim, as those who watch or use it see it."""

    pool: str
    device: str  # the DRA device name: "gpu-0", "gpu-0-mig-1g10gb-19-0"
    kind: str  # "gpu" or "mig"
    uuid: str  # the GPU's, or the MIG device's
    parent_uuid: str = ""  # a MIG device's GPU
    profile: str = ""  # a MIG device's profile: "1g.10gb"
    share_id: str = ""  # the scheduler's share of a device several claims hold
    sharing: str = ""  # TIME_SLICING, MPS, or "" (the claim has the device to itself)
    interval: str = ""  # the time slice the prepare set on the GPU
    mps_thread_percentage: int | None = None  # the MPS limits its clients run under (None: no limit)
    mps_memory_mib: int | None = None
    # A GPU with strict MPS shares: MPS enforces those limits whatever the other claims on it ask
    # (otherwise up to the largest limit among them: docs/dra.md, "MPS limits").
    mps_strict: bool = False


def identify(prepared: PreparedDevice, device: DraDevice, share: ClaimShare,
             made: MigDevice | None = None) -> DeviceIdentity:
    """The identity of `prepared`, published as `device`, in a claim whose sharing is `share`; `made`:
    the MIG device a prepare made for a placement (migStrategy dynamic)."""
    uuid, parent, profile = device.uuid, "", ""
    if made is not None:
        uuid, parent, profile = made.uuid, made.parent_uuid, made.profile
    elif device.kind == "mig":
        parent, profile = device.gpu_uuid, str(device.attributes.get("profile", {}).get("string", ""))
    interval = dict(share.timeslices).get(device.gpu_uuid, "")
    sharing, threads, memory, strict = "", None, None, False
    if device.gpu_uuid in share.mps_gpus:
        sharing, strict = MPS, device.strict
        threads, memory = share.mps_limits.thread_percentage, share.mps_limits.memory_of(device.gpu_uuid)
    elif interval or device.shared or prepared.share_id:
        sharing = TIME_SLICING  # a GPU several claims use without MPS takes turns
    return DeviceIdentity(pool=prepared.pool, device=prepared.device, kind=device.kind, uuid=uuid,
                          parent_uuid=parent, profile=profile, share_id=prepared.share_id, sharing=sharing,
                          interval=interval, mps_thread_percentage=threads, mps_memory_mib=memory,
                          mps_strict=strict)


def status_entry(driver: str, identity: DeviceIdentity) -> dict[str, object]:
    """The claim's `status.devices` entry (KEP-4817) for the device: `data` is free-form JSON."""
    data: dict[str, object] = {"type": identity.kind, "uuid": identity.uuid}
    if identity.kind == "mig":
        data |= {"parentUUID": identity.parent_uuid, "profile": identity.profile}
    if identity.sharing:
        sharing: dict[str, object] = {"strategy": identity.sharing}
        if identity.interval:
            sharing["interval"] = identity.interval
        mps = {key: value for key, value in (("activeThreadPercentage", identity.mps_thread_percentage),
                                             ("pinnedMemoryLimitMiB", identity.mps_memory_mib))
               if value is not None}
        if identity.mps_strict:
            mps["strictShares"] = True
        if identity.sharing == MPS:
            sharing["mps"] = mps
        data["sharing"] = sharing
    entry: dict[str, object] = {"driver": driver, "pool": identity.pool, "device": identity.device,
                                "data": data}
    if identity.share_id:
        entry["shareID"] = identity.share_id  # the API server matches it to the allocation's result
    return entry


def metadata_attributes(identity: DeviceIdentity, published: Attributes, healthy: bool) -> Attributes:
    """The device's attributes for its metadata file (KEP-5304, the slice's attribute form): those the
    slice publishes, and what the prepare knows besides: the UUID of a MIG device it made, the sharing
    and its MPS limits, whether the GPU is healthy."""
    attributes: Attributes = dict(published)
    if identity.uuid:
        attributes["uuid"] = {"string": identity.uuid}
    if identity.kind == "mig":
        attributes["parentUUID"] = {"string": identity.parent_uuid}
        attributes["profile"] = {"string": identity.profile}
    if identity.sharing:
        attributes["sharingStrategy"] = {"string": identity.sharing}
    if identity.share_id:
        attributes["shareID"] = {"string": identity.share_id}
    if identity.interval:
        attributes["timeSliceInterval"] = {"string": identity.interval}
    if identity.mps_thread_percentage is not None:
        attributes["mpsActiveThreadPercentage"] = {"int": identity.mps_thread_percentage}
    if identity.mps_memory_mib is not None:
        attributes["mpsPinnedMemoryLimitMiB"] = {"int": identity.mps_memory_mib}
    if identity.mps_strict:
        attributes["mpsStrictShares"] = {"bool": True}
    attributes["healthy"] = {"bool": healthy}
    return attributes


def claim_identities(prepared: Sequence[PreparedDevice], devices: Mapping[str, DraDevice], share: ClaimShare,
                     made: Mapping[str, MigDevice]) -> list[tuple[PreparedDevice, DeviceIdentity]]:
    """Each prepared device of a claim with its identity; a device no longer published (a config
    changed under a prepared claim) is left out, as nothing true can be said of it."""
    return [(p, identify(p, devices[p.device], share, made.get(p.device))) for p in prepared
            if p.device in devices]
