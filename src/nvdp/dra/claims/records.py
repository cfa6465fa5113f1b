"""The claim transaction's records: what the kubelet asks and is answered, and each prepared claim's
entry in the checkpoint with the steps it took. Plain data only (no gRPC, NVML or API client), so
`nvdp doctor` and the pool read a checkpoint without loading the plugin's edges.

A claim's entry is written before its first side effect and after each one (nvdp.dra.claims.mig and
nvdp.dra.claims.undo say what each step records); the entry's `state` says where it stands:

- `PrepareStarted`: written before anything is done for the claim; the uid-keyed effects (its CDI
  spec file, its MPS share and time slices) need no more record than this, as their undo finds them
  by the claim's UID alone. Each MIG step adds its own intent and result.
- `PrepareCompleted`: everything is made; the kubelet has (or will have) the devices.
- `Releasing`: an undo has begun (a failed prepare, an unprepare, a start's replay, the release of
  a deleted claim); what is left of it is finished by whoever next holds the node lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from msgspec import Struct

from nvdp.inventory.model import MigDevice

State = Literal["PrepareStarted", "PrepareCompleted", "Releasing"]
STARTED: State = "PrepareStarted"
COMPLETED: State = "PrepareCompleted"
RELEASING: State = "Releasing"


class ClaimRef(Struct, frozen=True):
    """One ResourceClaim the kubelet asks about."""

    namespace: str
    uid: str
    name: str


class PreparedDevice(Struct, frozen=True, omit_defaults=True):
    """One device handed to a prepared claim, as the kubelet receives it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    # Allocated for admin access (KEP-5018): handed out beside the claim that holds the device, which
    # it never keeps from anyone (not sent to the kubelet; kept in the checkpoint for the later checks).
    admin_access: bool = False
    # The scheduler's share of a device several claims hold (consumable capacity), as its status entry
    # names it; and the subrequest the request was allocated through ("large" of "gpus/large").
    share_id: str = ""
    subrequest: str = ""

    @property
    def request_ref(self) -> str:
        """The request as the allocation names it: "gpus", or "gpus/large" for a subrequest."""
        base = self.request_names[0] if self.request_names else ""
        return f"{base}/{self.subrequest}" if self.subrequest else base


class PrepareResult(Struct, frozen=True):
    """A claim's answer to NodePrepareResources: its devices, or why it failed (`error` non-empty,
    and `cause`, one of nvdp.dra.claims.causes.PREPARE_CAUSES, the kind of failure for the metrics)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    cause: str = ""


class ClaimLimits(Struct, frozen=True, omit_defaults=True):
    """One claim's MPS limits: its thread share, and its pinned-memory limit per GPU it limits."""

    thread_percentage: int | None = None  # None: all of the GPU's threads
    memory_mib: tuple[tuple[str, int], ...] = ()  # (GPU UUID, MiB); a GPU not listed: no limit

    def memory_of(self, gpu: str) -> int | None:
        return dict(self.memory_mib).get(gpu)

    def describe(self) -> str:
        threads = f"{self.thread_percentage}%" if self.thread_percentage is not None else "100%"
        memory = ", ".join(f"{mib} MiB on {uuid}" for uuid, mib in self.memory_mib) or "no memory limit"
        return f"{threads} threads, {memory}"


class ClaimShare(Struct, frozen=True, omit_defaults=True):
    """What one prepared claim's sharing needs; empty for a claim that shares nothing."""

    mps_gpus: tuple[str, ...] = ()  # the GPUs of the MPS daemon its containers use
    env: tuple[str, ...] = ()  # "KEY=value" for all its containers: the MPS pipe and client limits
    mps_limits: ClaimLimits = ClaimLimits()  # its part in its MPS daemon's ceiling (none: the whole GPU)
    timeslices: tuple[tuple[str, str], ...] = ()  # (GPU UUID, interval) set when it was prepared

    @property
    def uses_mps(self) -> bool:
        return bool(self.mps_gpus)


class MadeInstance(Struct, frozen=True):
    """A MIG device made for a claim, as checkpoints before the step records held it (read only)."""

    device: str
    mig: MigDevice


class MigModeStep(Struct, frozen=True, tag="mig-mode", omit_defaults=True):
    """A GPU's MIG mode switched for the claim. Intent: the GPU and the mode; result: `done`. Its undo
    leaves the mode as it is: the mode belongs to the GPU, not to a claim, and the next claim that
    needs the other mode switches it (no device is lost or held by leaving it)."""

    gpu_uuid: str
    on: bool
    done: bool = False


class MigDeviceStep(Struct, frozen=True, tag="mig-device", omit_defaults=True):
    """A MIG device made for the claim: a GPU instance at a placement, then one compute instance
    over it. The intent (GPU, profile, placement) is recorded before the GPU instance is made; the GPU
    instance's id after it; the MIG device (UUID and ids, as NVML lists it) after the compute instance.
    Identity at undo is by what NVML says (nvdp.dra.claims.mig.find_made), never by the ids alone,
    which NVML gives to the next instance as soon as one is gone."""

    device: str  # the DRA device it serves: "gpu-0-mig-3g40gb-9-0"
    gpu_uuid: str
    profile: str
    gi_profile_id: int
    start: int
    size: int
    gi_id: int | None = None
    mig: MigDevice | None = None
    # Its destroy has begun (recorded before the compute instance goes): a GPU instance left at the
    # step's placement with its id and no compute instance is then the step's, half destroyed.
    releasing: bool = False

    @property
    def made(self) -> bool:
        return self.mig is not None

    @property
    def where(self) -> str:
        last = self.start + self.size - 1
        return f"{self.profile} at memory slices {self.start}..{last} of GPU {self.gpu_uuid}"


Step = MigModeStep | MigDeviceStep


class ClaimEntry(Struct, frozen=True):
    """One claim this plugin prepared (or started to prepare, or is releasing) and what it did."""

    uid: str
    namespace: str
    name: str
    state: State
    devices: tuple[PreparedDevice, ...] = ()
    # Its sharing (MPS daemon, client limits, intervals); absent in files of plugins before sharing.
    share: ClaimShare = ClaimShare()
    # The side effects on the GPUs, in the order they were begun (migStrategy dynamic).
    steps: tuple[Step, ...] = ()
    # The claim's status.devices entries still to be written (every prepare, a write that failed, a
    # device remade).
    status_pending: bool = False
    # The claim's name in its pod (`resource.kubernetes.io/pod-claim-name`, a claim made from a template):
    # where its containers find its device metadata files; and how often those were written.
    pod_claim_name: str = ""
    metadata_generation: int = 0
    # Checkpoints before `steps` listed the made MIG devices here; read into `steps` on load.
    instances: tuple[MadeInstance, ...] = ()

    @property
    def made(self) -> tuple[MigDeviceStep, ...]:
        """The MIG devices made for the claim (complete steps)."""
        return tuple(s for s in self.steps if isinstance(s, MigDeviceStep) and s.mig is not None)

    def upgraded(self) -> ClaimEntry:
        """The entry with an older file's `instances` as complete MIG steps."""
        if not self.instances:
            return self
        steps = tuple(MigDeviceStep(device=m.device, gpu_uuid=m.mig.parent_uuid, profile=m.mig.profile,
                                    gi_profile_id=m.mig.gi_profile_id or 0, start=m.mig.placement_start or 0,
                                    size=m.mig.placement_size or 0, gi_id=m.mig.gi_id, mig=m.mig)
                      for m in self.instances)
        return ClaimEntry(uid=self.uid, namespace=self.namespace, name=self.name, state=self.state,
                          devices=self.devices, share=self.share, steps=steps + self.steps,
                          status_pending=self.status_pending, pod_claim_name=self.pod_claim_name,
                          metadata_generation=self.metadata_generation)


class OwnedMig(Struct, frozen=True):
    """The MIG devices the checkpoint says are the plugin's: made (by UUID), or begun and not yet
    recorded as made (by GPU, GI profile and placement: a crash after NVML made it, before the record)."""

    uuids: frozenset[str] = frozenset()
    begun: frozenset[tuple[str, int, int, int]] = frozenset()

    def owns(self, mig: MigDevice) -> bool:
        if mig.uuid in self.uuids:
            return True
        return (mig.parent_uuid, mig.gi_profile_id if mig.gi_profile_id is not None else -1,
                mig.placement_start if mig.placement_start is not None else -1,
                mig.placement_size if mig.placement_size is not None else -1) in self.begun


def owned_mig(entries: Iterable[ClaimEntry]) -> OwnedMig:
    uuids: set[str] = set()
    begun: set[tuple[str, int, int, int]] = set()
    for entry in entries:
        for step in entry.upgraded().steps:
            if not isinstance(step, MigDeviceStep):
                continue
            if step.mig is not None:
                uuids.add(step.mig.uuid)
            else:
                begun.add((step.gpu_uuid, step.gi_profile_id, step.start, step.size))
    return OwnedMig(frozenset(uuids), frozenset(begun))
