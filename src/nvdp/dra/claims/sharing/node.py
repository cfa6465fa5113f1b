"""What a claim's sharing does on the node: the time-slice interval, the MPS daemon, the client limits.

`claim_share` (pure) turns the sharing each of a claim's devices gets (`nvdp.dra.claims.sharing.gpuconfig`:
the claim's and its classes' GpuConfig, else the node's sharing config) into a `ClaimShare`: the GPUs whose
MPS daemon it joins, its MPS limits (for that daemon's ceiling and as the client variables of its
containers), the intervals to set. An MPS limit the config does not set comes from the capacity the
claim was allocated (`with_consumed`; nvdp.dra.claims.sharing.capacity: `memory` is its pinned-memory
limit, `replicas` r of a GPU's N its r/N of the threads). On a GPU with strict shares a claim's limits
must be that GPU's one share (nvdp.dra.claims.sharing.strict). `NodeSharing` carries it out at prepare
and undoes it at unprepare; the checkpoint keeps each claim's `ClaimShare`, so a restarted plugin starts
the same daemons and writes the same spec again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from nvdp.cdi.spec import ContainerEdits, Mount
from nvdp.dra.claims.causes import INVALID_CONFIG, SHARING_SETUP
from nvdp.dra.claims.check import ClaimProblem
from nvdp.dra.claims.records import ClaimLimits
from nvdp.dra.claims.records import ClaimShare as ClaimShare
from nvdp.dra.claims.sharing.capacity import capacity_limits as capacity_limits
from nvdp.dra.claims.sharing.capacity import consumed_capacity as consumed_capacity
from nvdp.dra.claims.sharing.capacity import share_limits
from nvdp.dra.claims.sharing.config_drivers import near_miss_configs
from nvdp.dra.claims.sharing.events import CONFIG_DRIVER_MISMATCH
from nvdp.dra.claims.sharing.gpuconfig import DeviceSharing, MpsLimits, SharingProblem, device_sharing
from nvdp.dra.claims.sharing.mps import CONTAINER_PIPE_DIR, ClaimMps, MpsUnavailable, claim_limits, client_env
from nvdp.dra.claims.sharing.strict import check_strict, with_offered
from nvdp.dra.claims.sharing.timeslice import TimesliceError, set_timeslice
from nvdp.dra.pool.devices import DraDevice

# As NVIDIA's DRA driver mounts the MPS folders: written to by the clients, nothing else.
MPS_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")
NODE_SOURCE = "node config (sharing.mps)"


def node_default(device: DraDevice) -> DeviceSharing:
    """A device's sharing when no claim or class config names it: the node's sharing config, whose
    MPS replicas split the GPU's threads and memory evenly, as the device plugin's MPS daemon does."""
    if device.sharing == "mps" and device.kind == "gpu":
        return DeviceSharing(strategy="MPS", source=NODE_SOURCE, mps=share_limits(device))
    if device.sharing == "time-slicing":
        return DeviceSharing(strategy="TimeSlicing", source="node config (sharing.timeSlicing)")
    return DeviceSharing()


def with_consumed(sharing: Mapping[str, DeviceSharing], devices: Mapping[str, DraDevice],
                  consumed: Mapping[str, Mapping[str, int]]) -> dict[str, DeviceSharing]:
    """Each MPS device's limits, those its GpuConfig leaves unset taken from its allocated capacity.
    The node's default (1/N of the GPU) is what a claim allocated with the default request policy
    consumes; a claim allocated more (`capacity.requests`) gets what it was allocated."""
    out = dict(sharing)
    for name, share in sharing.items():
        taken = consumed.get(name)
        if share.strategy != "MPS" or not taken or name not in devices:
            continue
        derived = capacity_limits(devices[name], taken)
        given = MpsLimits() if share.source == NODE_SOURCE else share.mps or MpsLimits()
        fallback = share.mps or MpsLimits()
        limits = MpsLimits(
            active_thread_percentage=_first(given.active_thread_percentage, derived.active_thread_percentage,
                                            fallback.active_thread_percentage),
            pinned_memory_limit_mib=_first(given.pinned_memory_limit_mib, derived.pinned_memory_limit_mib,
                                           fallback.pinned_memory_limit_mib))
        out[name] = msgspec.structs.replace(share, mps=limits)
    return out


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def claim_share(devices: Sequence[DraDevice], sharing: Mapping[str, DeviceSharing]) -> ClaimShare:
    """The claim's share from each device's sharing (`devices` in the claim's order, each once);
    SharingProblem when the devices' sharing cannot go together in one container."""
    mps = [d for d in devices if sharing.get(d.name, DeviceSharing()).strategy == "MPS"]
    if mps and len(mps) != len(devices):
        others = [d.name for d in devices if d not in mps]
        raise SharingProblem(
            f"devices {', '.join(d.name for d in mps)} are shared through MPS but {', '.join(others)} are "
            "not; a container uses MPS for all its GPUs or for none: give every request of the claim the "
            "same sharing strategy")
    env: dict[str, str] = {}
    mps_limits = ClaimLimits()
    if mps:
        limits = [sharing[d.name].mps or MpsLimits() for d in mps]
        threads = [x.active_thread_percentage for x in limits if x.active_thread_percentage is not None]
        # One client process has one thread share: the smallest any of its devices' configs asks for.
        thread_share = min(threads) if threads else None
        env = client_env(thread_share, [x.pinned_memory_limit_mib for x in limits])
        mps_limits = claim_limits(thread_share, [(d.gpu_uuid, x.pinned_memory_limit_mib)
                                                 for d, x in zip(mps, limits, strict=True)])
    timeslices = tuple(
        (d.gpu_uuid, s.interval) for d in devices
        if (s := sharing.get(d.name, DeviceSharing())).strategy == "TimeSlicing" and s.interval is not None
        and d.kind == "gpu"
    )
    return ClaimShare(mps_gpus=tuple(dict.fromkeys(d.gpu_uuid for d in mps)),
                      env=tuple(f"{k}={v}" for k, v in env.items()), timeslices=timeslices,
                      mps_limits=mps_limits)


class ClaimWarner(Protocol):
    """Where warnings about a claim go (nvdp.dra.claims.sharing.events.ClaimEvents: Events on the claim)."""

    def warning(self, claim: Mapping[str, Any], reason: str, message: str) -> None: ...


class NodeSharing:
    """Carries out claims' shares on this node: intervals through nvidia-smi, MPS through `mps`
    (None when the plugin runs without MPS, so that MPS claims are refused with the reason).
    `warner` hears of configs addressed to a mistyped driver name (None: they are logged)."""

    def __init__(self, *, driver: str, mps: ClaimMps | None, no_mps_reason: str,
                 log: logging.Logger, timeslice: Callable[[str, str], None] = set_timeslice,
                 warner: ClaimWarner | None = None) -> None:
        self.driver = driver
        self.mps = mps
        self.no_mps_reason = no_mps_reason
        self.log = log
        self._timeslice = timeslice
        self._warner = warner
        # The interval this process last set on each GPU: claims that ask for the same one run no
        # nvidia-smi (a process per claim, under the node lock, when many pods start at once).
        self._intervals: dict[str, str] = {}

    def share_of(self, claim: Mapping[str, Any], devices: Mapping[str, DraDevice],
                 claimed: Sequence[DraDevice]) -> ClaimShare:
        """The claim's share; ClaimProblem naming the field when its config is invalid."""
        for message in near_miss_configs(claim, self.driver):
            if self._warner is not None:
                self._warner.warning(claim, CONFIG_DRIVER_MISMATCH, message)
            else:
                meta = claim.get("metadata") or {}
                self.log.warning("Claim %s/%s: %s", meta.get("namespace"), meta.get("name"), message)
        consumed = with_offered(claimed, consumed_capacity(claim, self.driver))
        try:
            sharing = device_sharing(claim, self.driver, devices, default=node_default)
            sharing = with_consumed(sharing, devices, consumed)
            share = claim_share(claimed, sharing)
        except SharingProblem as err:
            raise ClaimProblem(f"invalid sharing config: {err}", INVALID_CONFIG) from None
        check_strict(claim, claimed, sharing, consumed, share)
        return share

    def apply(self, claim_uid: str, share: ClaimShare) -> ContainerEdits:
        """Set the claim's intervals and join its MPS daemon; the edits its containers get.
        ClaimProblem (nothing joined) when that cannot be done."""
        for gpu, interval in share.timeslices:
            if self._intervals.get(gpu) == interval:
                continue  # this process set it already: another nvidia-smi run changes nothing
            try:
                self._timeslice(gpu, interval)
            except TimesliceError as err:
                self._intervals.pop(gpu, None)
                raise ClaimProblem(f"cannot set the time slice of GPU {gpu} to {interval}: {err}",
                                   SHARING_SETUP) from None
            self._intervals[gpu] = interval
            self.log.info("GPU %s: time slice set to %s", gpu, interval)
        if share.uses_mps:
            if self.mps is None:
                raise ClaimProblem(f"the claim asks for MPS, which this plugin does not run: "
                                   f"{self.no_mps_reason}", SHARING_SETUP)
            try:
                self.mps.use(claim_uid, share.mps_gpus, share.mps_limits)
            except MpsUnavailable as err:
                raise ClaimProblem(str(err), SHARING_SETUP) from None
        return self.edits(share)

    def edits(self, share: ClaimShare) -> ContainerEdits:
        """The claim's container edits (no side effects: for writing a lost spec again)."""
        if not share.uses_mps or self.mps is None:
            return ContainerEdits(env=share.env)
        mount = self.mps.mount(share.mps_gpus)
        return ContainerEdits(env=share.env, mounts=(
            Mount(host_path=mount.shm_dir, container_path="/dev/shm", options=MPS_MOUNT_OPTIONS),
            Mount(host_path=mount.pipe_dir, container_path=CONTAINER_PIPE_DIR, options=MPS_MOUNT_OPTIONS),
        ))

    def release(self, claim_uid: str) -> None:
        if self.mps is not None:
            self.mps.release(claim_uid)

    def adopt(self, claim_uid: str, share: ClaimShare) -> None:
        """A claim prepared before a restart: its MPS daemon runs again."""
        if share.uses_mps and self.mps is not None:
            try:
                self.mps.adopt(claim_uid, share.mps_gpus, share.mps_limits)
            except MpsUnavailable as err:
                self.log.error("Claim %s used MPS on %s before the restart, and its daemon cannot start "
                               "again: %s", claim_uid, ", ".join(share.mps_gpus), err)

    def settle(self) -> None:
        """Once every prepared claim is adopted: the MPS daemons no claim uses are withdrawn."""
        if self.mps is not None:
            self.mps.settle()

    def stop(self) -> bool:
        return self.mps.stop() if self.mps is not None else True
