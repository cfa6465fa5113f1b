"""The MIG devices the DRA plugin makes for its claims (migStrategy dynamic).

A claim allocated a placement device (nvdp.dra.partitions) gets its MIG device made at prepare and
destroyed at unprepare. What was made is recorded in the claim's checkpoint entry as soon as it exists
(`progress`), so the checkpoint is the one record of which MIG devices are nvdp's: a crash between
the make and the end of the prepare still leaves them owned, and the rollback at start destroys them.
A MIG device nvdp did not make is never destroyed here. A prepare of a claim prepared before whose
MIG device is gone (the node rebooted: MIG devices do not survive it) makes it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from msgspec import Struct

from nvdp.dra.causes import MIG_CREATE
from nvdp.dra.claims import ClaimProblem
from nvdp.dra.devices import DraDevice
from nvdp.inventory.model import MigDevice


class MadeInstance(Struct, frozen=True):
    """A MIG device made for a claim: the DRA device it serves and the MIG device NVML reported."""

    device: str  # "gpu-0-mig-3g40gb-9-0"
    mig: MigDevice

    @property
    def gpu_uuid(self) -> str:
        return self.mig.parent_uuid


class InstanceControl(Protocol):
    """NVML's MIG calls (nvdp.inventory.mig_control.MigControl)."""

    def live(self, gpu_uuid: str) -> tuple[MigDevice, ...]: ...

    def set_mig_mode(self, gpu_uuid: str, on: bool) -> bool: ...

    def create(self, gpu_uuid: str, gi_profile_id: int, start: int, size: int, profile: str) -> MigDevice: ...

    def destroy(self, gpu_uuid: str, gi_id: int, ci_id: int) -> None: ...


# Writes a claim's device status for this driver (nvdp.kube.apply_device_status, bound to the client
# and driver): namespace, name, entries.
StatusWriter = Callable[[str, str, list[dict[str, Any]]], None]


def device_status(driver: str, pool: str, made: Iterable[MadeInstance]) -> list[dict[str, Any]]:
    """The claim's `status.devices` entries for its MIG devices (KEP-4817): the UUID, parent UUID and
    profile monitoring (dcgm-exporter) attributes a MIG device's metrics by."""
    return [{"driver": driver, "pool": pool, "device": m.device,
             "data": {"uuid": m.mig.uuid, "parentUUID": m.mig.parent_uuid, "profile": m.mig.profile}}
            for m in made]


class ClaimInstances:
    """Makes and destroys the MIG devices of claims; `control` None: no device is ever made (a node
    without dynamic MIG), and a claim allocated a placement device is refused. `status`: writes the
    made MIG devices into the claim's status (None: not written)."""

    def __init__(self, control: InstanceControl | None, log: logging.Logger,
                 status: StatusWriter | None = None) -> None:
        self._control = control
        self._log = log
        self._status = status

    def report(self, namespace: str, name: str, driver: str, pool: str, made: Sequence[MadeInstance]) -> None:
        """The claim's status carries its MIG devices' UUIDs; a failure is logged, the prepare stands
        (the status is for monitoring; the container already gets its device)."""
        if self._status is None or not made:
            return
        try:
            self._status(namespace, name, device_status(driver, pool, made))
        except Exception as err:
            self._log.warning("Cannot write the MIG device UUIDs into the status of claim %s/%s: %s",
                              namespace, name, err)

    def make(self, what: str, devices: Sequence[DraDevice], have: Sequence[MadeInstance],
             progress: Callable[[tuple[MadeInstance, ...]], None]) -> tuple[MadeInstance, ...]:
        """The MIG devices of the claim's placement devices: those in `have` that still exist, the
        others made now. Each one made is passed to `progress` at once (with all before it). A failure
        destroys what this call made and raises ClaimProblem with NVML's answer and the fix."""
        wanted = [d for d in devices if d.placement is not None]
        whole = [d for d in devices if d.placement is None and d.counter_set is not None]
        if not wanted and not whole:
            return ()
        if self._control is None:
            if not wanted:
                return ()
            raise ClaimProblem(f"{what}: device {wanted[0].name} is a MIG placement, but this plugin "
                               "does not make MIG devices (migStrategy is not dynamic in its config); the "
                               "plugin republishes its devices, and the claim is allocated again", MIG_CREATE)
        control = self._control
        try:
            # A GPU published both whole and in MIG placements (Hopper and later) is switched to the
            # mode the claim needs; the counters keep a whole GPU and its placements from being
            # allocated together, so no other claim's device is on it then.
            for gpu in dict.fromkeys(d.gpu_uuid for d in whole):
                if control.set_mig_mode(gpu, False):
                    self._log.info("%s: turned MIG mode off on GPU %s for the whole GPU", what, gpu)
            for gpu in dict.fromkeys(d.gpu_uuid for d in wanted):
                if control.set_mig_mode(gpu, True):
                    self._log.info("%s: turned MIG mode on on GPU %s for its MIG devices", what, gpu)
        except Exception as err:
            raise ClaimProblem(f"{what}: {err}", MIG_CREATE) from None
        kept = {m.device: m for m in have}
        live_by_gpu: dict[str, frozenset[str]] = {}
        out: list[MadeInstance] = []
        made_now: list[MadeInstance] = []
        try:
            for device in wanted:
                old = kept.get(device.name)
                if old is not None:
                    if old.gpu_uuid not in live_by_gpu:
                        live_by_gpu[old.gpu_uuid] = frozenset(m.uuid for m in control.live(old.gpu_uuid))
                    if old.mig.uuid in live_by_gpu[old.gpu_uuid]:
                        out.append(old)
                        continue
                    self._log.info("%s: MIG device %s of %s is gone (the node rebooted?); making it again",
                                   what, old.mig.uuid, device.name)
                p = device.placement
                assert p is not None
                mig = control.create(device.gpu_uuid, p.gi_profile_id, p.start, p.size, p.profile)
                made = MadeInstance(device=device.name, mig=mig)
                made_now.append(made)
                out.append(made)
                progress(tuple(out))
                self._log.info("%s: made MIG device %s (%s, GPU instance %d at memory slices %d..%d) for %s",
                               what, mig.uuid, p.profile, mig.gi_id, p.start, p.start + p.size - 1,
                               device.name)
        except Exception as err:
            left = self.destroy(made_now)
            raise ClaimProblem(f"{what}: {err}" + (f"; and undoing it: {left}" if left else ""),
                               MIG_CREATE) from None
        return tuple(out)

    def destroy(self, made: Sequence[MadeInstance]) -> str:
        """Destroy the claim's MIG devices; "" when all are gone, else what failed (retried by the
        kubelet's next unprepare)."""
        if self._control is None or not made:
            return ""
        failed = []
        for m in made:
            try:
                self._control.destroy(m.gpu_uuid, m.mig.gi_id, m.mig.ci_id)
                self._log.info("Destroyed MIG device %s (%s) of %s", m.mig.uuid, m.mig.profile, m.device)
            except Exception as err:
                failed.append(str(err))
        return "; ".join(failed)
