"""The MIG devices the DRA plugin makes for its claims (migStrategy dynamic), as recorded steps.

A claim allocated a placement device (nvdp.dra.pool.partitions) gets its MIG device made at prepare and
destroyed when the claim is released. Every NVML call that changes a GPU is preceded by its intent in
the claim's record and followed by its result (`record` saves the claim's steps durably before the
next call):

    intent (GPU, profile, placement)  ->  GPU instance made  ->  its id  ->  compute instance  ->  MIG device

so a kill between any two leaves a record that says what may exist. The one undo of a step
(`undo_step`) finds what the step made by what NVML says about it now (`find_made`): a made device by
its UUID, a device begun and not recorded as made by its placement and profile. NVML gives an id to
the next instance as soon as one is gone, so an id alone never identifies anything, and a MIG device
nvdp did not make (an admin's, at the same place) is never destroyed. A prepare of a claim prepared
before whose MIG device is gone (a reboot: MIG devices do not survive it) makes it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from msgspec.structs import replace

from nvdp.dra.claims.causes import MIG_CREATE
from nvdp.dra.claims.check import ClaimProblem
from nvdp.dra.claims.records import MigDeviceStep, MigModeStep, Step
from nvdp.dra.pool.devices import DraDevice
from nvdp.inventory.mig_control import GpuInstance
from nvdp.inventory.model import MigDevice


class InstanceControl(Protocol):
    """NVML's MIG calls (nvdp.inventory.mig_control.MigControl)."""

    def live(self, gpu_uuid: str) -> tuple[MigDevice, ...]: ...

    def gpu_instances(self, gpu_uuid: str) -> tuple[GpuInstance, ...]: ...

    def set_mig_mode(self, gpu_uuid: str, on: bool) -> bool: ...

    def create_gpu_instance(self, gpu_uuid: str, gi_profile_id: int, start: int, size: int,
                            profile: str) -> int: ...

    def create_compute_instance(self, gpu_uuid: str, gi_id: int, gi_profile_id: int,
                                profile: str) -> MigDevice: ...

    def destroy_gpu_instance(self, gpu_uuid: str, gi_id: int) -> None: ...


# Saves the claim's steps as they now stand (durably: the checkpoint) before the next NVML call.
Record = Callable[[tuple[Step, ...]], None]


def find_made(step: MigDeviceStep, live: Sequence[GpuInstance], others: Collection[str] = ()
              ) -> GpuInstance | None:
    """The GPU instance `step` made, as NVML lists it now; None when it is gone (or never was).

    Made (UUID recorded): only the instance holding that MIG device, or, once its destroy has begun
    (`releasing`), the instance with the recorded id left at the placement without a compute instance.
    Begun (no UUID yet): the instance of the step's profile at its placement (its id too, once
    recorded) holding no MIG device another claim's record owns (`others`, UUIDs): the placement was
    free when the intent was written, so what is there now was made by the step."""
    at = [g for g in live
          if (g.gi_profile_id, g.start, g.size) == (step.gi_profile_id, step.start, step.size)]
    if step.mig is not None:
        found = next((g for g in at if step.mig.uuid in g.mig_uuids), None)
        if found is None and step.releasing:
            found = next((g for g in at if g.gi_id == step.gi_id and not g.mig_uuids), None)
        return found
    return next((g for g in at if (step.gi_id is None or g.gi_id == step.gi_id)
                 and not set(g.mig_uuids) & set(others)), None)


class ClaimInstances:
    """Makes and undoes the MIG steps of claims; `control` None: no device is ever made (a node without
    dynamic MIG), and a claim allocated a placement device is refused. The claim's status names the
    devices made (nvdp.dra.claims.identity)."""

    def __init__(self, control: InstanceControl | None, log: logging.Logger) -> None:
        self._control = control
        self._log = log

    def make(self, what: str, devices: Sequence[DraDevice], steps: tuple[Step, ...], record: Record
             ) -> tuple[Step, ...]:
        """The claim's steps once its placement devices all have a live MIG device: made steps whose
        device still exists are kept, the others made (again) now, each call recorded before and after
        through `record`. A failure undoes what this call began and raises ClaimProblem with NVML's
        answer and the fix; the steps recorded before it stay for the claim's own undo."""
        wanted = [d for d in devices if d.placement is not None]
        whole = [d for d in devices if d.placement is None and d.counter_set is not None]
        if not wanted and not whole:
            return steps
        if self._control is None:
            if not wanted:
                return steps
            raise ClaimProblem(f"{what}: device {wanted[0].name} is a MIG placement, but this plugin "
                               "does not make MIG devices (migStrategy is not dynamic in its config); the "
                               "plugin republishes its devices, and the claim is allocated again", MIG_CREATE)
        now = list(steps)

        def save(step: Step, *, drop: bool = False) -> None:
            """Record `step` in place of the claim's step for the same GPU or device (or last)."""
            at = next((i for i, s in enumerate(now) if same_effect(s, step)), None)
            if drop:
                if at is not None:
                    del now[at]
            elif at is None:
                now.append(step)
            else:
                now[at] = step
            record(tuple(now))

        begun: list[str] = []  # the devices whose steps this call began
        try:
            # A GPU published both whole and in MIG placements (Hopper and later) is switched to the
            # mode the claim needs; the counters keep a whole GPU and its placements from being
            # allocated together, and the holder check refuses a claim whose devices overlap another's.
            modes = [(gpu, False) for gpu in dict.fromkeys(d.gpu_uuid for d in whole)]
            modes += [(gpu, True) for gpu in dict.fromkeys(d.gpu_uuid for d in wanted)]
            for gpu, on in modes:
                save(MigModeStep(gpu_uuid=gpu, on=on))
                if self._control.set_mig_mode(gpu, on):
                    self._log.info("%s: turned MIG mode %s on GPU %s", what, "on" if on else "off", gpu)
                save(MigModeStep(gpu_uuid=gpu, on=on, done=True))
            for device in wanted:
                self._make_one(what, device, now, begun, save)
        except Exception as err:
            left = []
            for step in [s for s in now if isinstance(s, MigDeviceStep) and s.device in begun]:
                problem = self.undo_step(step, (), save)
                if problem:
                    left.append(problem)
                else:
                    save(step, drop=True)
            text = str(err) if isinstance(err, ClaimProblem) else f"{what}: {err}"
            raise ClaimProblem(text + (f"; and undoing it: {'; '.join(left)}" if left else ""),
                               MIG_CREATE) from None
        return tuple(now)

    def _make_one(self, what: str, device: DraDevice, now: list[Step], begun: list[str],
                  save: Callable[..., None]) -> None:
        assert self._control is not None and device.placement is not None
        control, p = self._control, device.placement
        old = next((s for s in now if isinstance(s, MigDeviceStep) and s.device == device.name), None)
        if old is not None and old.mig is not None:
            if old.mig.uuid in {m.uuid for m in control.live(old.gpu_uuid)}:
                return
            self._log.info("%s: MIG device %s of %s is gone (the node rebooted?); making it again",
                           what, old.mig.uuid, device.name)
        step = MigDeviceStep(device=device.name, gpu_uuid=device.gpu_uuid, profile=p.profile,
                             gi_profile_id=p.gi_profile_id, start=p.start, size=p.size)
        # The placement must be free before the intent is written: whatever is found there after a
        # crash is then the step's own (a device made in the moment between this look and the create,
        # by someone else, is the one case this cannot tell).
        taken = [g for g in control.gpu_instances(device.gpu_uuid)
                 if g.start < p.start + p.size and p.start < g.start + g.size]
        if taken:
            held = ", ".join(f"GPU instance {g.gi_id} at memory slices {g.start}..{g.start + g.size - 1}"
                             + (f" ({', '.join(g.mig_uuids)})" if g.mig_uuids else " (no compute instance)")
                             for g in taken)
            raise ClaimProblem(f"{what}: cannot make {step.where} for {device.name}: {held} holds those "
                               "memory slices, and this plugin did not make it for this claim; delete it "
                               "(nvidia-smi mig -dci / -dgi) or delete the pod to have the claim allocated "
                               "elsewhere once the plugin republishes", MIG_CREATE)
        save(step)
        begun.append(device.name)
        try:
            gi_id = control.create_gpu_instance(device.gpu_uuid, p.gi_profile_id, p.start, p.size, p.profile)
        except Exception:
            save(step, drop=True)  # NVML made nothing: the intent goes, so no undo looks there
            raise
        step = replace(step, gi_id=gi_id)
        save(step)
        mig = control.create_compute_instance(device.gpu_uuid, gi_id, p.gi_profile_id, p.profile)
        save(replace(step, mig=mig))
        self._log.info("%s: made MIG device %s (%s, GPU instance %d at memory slices %d..%d) for %s",
                       what, mig.uuid, p.profile, gi_id, p.start, p.start + p.size - 1, device.name)

    def undo_step(self, step: Step, others: Collection[str], record: Callable[[Step], None]) -> str:
        """Undo one step: "" when what it made is gone (or was never made), else what failed (the step
        stays recorded and its undo is tried again). `others`: the MIG UUIDs other claims own;
        `record` saves the step as it changes (its destroy begun) before the destroy."""
        if isinstance(step, MigModeStep) or self._control is None:
            return ""  # the mode stays (MigModeStep says why)
        try:
            found = find_made(step, self._control.gpu_instances(step.gpu_uuid), others)
            if found is None:
                self._log.info("MIG device of %s (%s) is already gone", step.device, step.where)
                return ""
            if step.mig is not None and not step.releasing:
                record(replace(step, releasing=True))
            self._control.destroy_gpu_instance(step.gpu_uuid, found.gi_id)
        except Exception as err:
            return f"cannot destroy the MIG device {step.where} of {step.device}: {err}"
        self._log.info("Destroyed MIG device %s (%s) of %s", step.mig.uuid if step.mig else "(being made)",
                       step.where, step.device)
        return ""


def same_effect(a: Step, b: Step) -> bool:
    """Whether two steps are the same effect at different stages (a device's, or a GPU's mode)."""
    if isinstance(a, MigDeviceStep) and isinstance(b, MigDeviceStep):
        return a.device == b.device
    return isinstance(a, MigModeStep) and isinstance(b, MigModeStep) and a.gpu_uuid == b.gpu_uuid
