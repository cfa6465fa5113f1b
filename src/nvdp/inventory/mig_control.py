"""Making and destroying MIG devices through NVML (migStrategy dynamic). All NVML calls that change a
GPU's MIG state stay in this module; every failure is a MigControlError naming the GPU, the placement,
NVML's answer and the fix, and a create that fails half-way destroys what it made before raising.

A MIG device is a GPU instance (GI: memory slices and their engines, at a placement) holding one
compute instance (CI) that spans all of it, as NVIDIA's DRA driver and `nvidia-smi mig -cgi ... -C`
make them. The CI profile is the one NVML reports with the GI's slice count, not a table here.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import pynvml
from msgspec import Struct

from nvdp.inventory.model import MigDevice
from nvdp.inventory.nvml import NvmlSession, error_name, read_mig_devices

# What NVML answers when a placement is taken, and what that means to whoever reads the error.
_TAKEN = (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, pynvml.NVML_ERROR_IN_USE)


class GpuInstance(Struct, frozen=True):
    """A GPU instance as NVML lists it, with or without compute instances (a create cut short leaves
    one without): its id, GI profile id, placement and the UUIDs of its MIG devices."""

    gi_id: int
    gi_profile_id: int
    start: int
    size: int
    mig_uuids: tuple[str, ...] = ()


class MigControlError(Exception):
    """NVML refused a MIG change; the message names the GPU, what was asked, NVML's answer and the fix.
    `taken`: the placement (or its slices) is held by another MIG device."""

    def __init__(self, message: str, *, taken: bool = False) -> None:
        super().__init__(message)
        self.taken = taken


class MigControl:
    """Create, destroy and list MIG devices of the node's GPUs through NVML."""

    def __init__(self, driver_root: str = "/", container_driver_root: str = "/driver-root") -> None:
        self._session = NvmlSession(driver_root, container_driver_root)

    def live(self, gpu_uuid: str) -> tuple[MigDevice, ...]:
        """The MIG devices the GPU has now (empty while MIG mode is off)."""
        with self._session:
            handle, index = self._gpu(gpu_uuid)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, "read the MIG mode", e) from None
            if current != pynvml.NVML_DEVICE_MIG_ENABLE:
                return ()
            try:
                return read_mig_devices(index, gpu_uuid, handle)
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, "list the MIG devices", e) from None

    def set_mig_mode(self, gpu_uuid: str, on: bool) -> bool:
        """Switch the GPU's MIG mode (Hopper and later switch at once); True when it was switched, False
        when it already was so. Refused while a process runs on the GPU, and when the switch is left
        pending (a GPU that needs a reset for it: Ampere)."""
        wanted = pynvml.NVML_DEVICE_MIG_ENABLE if on else pynvml.NVML_DEVICE_MIG_DISABLE
        what = "turn MIG mode " + ("on" if on else "off")
        with self._session:
            handle, _ = self._gpu(gpu_uuid)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
                if current == wanted:
                    return False
                running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, what, e) from None
            if running:
                pids = ", ".join(str(p.pid) for p in running)
                raise MigControlError(f"GPU {gpu_uuid}: cannot {what}: processes {pids} run on it; it is "
                                      "switched once they end (the kubelet retries the prepare)")
            try:
                pynvml.nvmlDeviceSetMigMode(handle, wanted)
                current, pending = pynvml.nvmlDeviceGetMigMode(handle)
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, what, e) from None
            if current != wanted:
                raise MigControlError(f"GPU {gpu_uuid}: cannot {what} without a GPU reset (the switch is "
                                      f"pending: current {current}, pending {pending}); reset the GPU "
                                      f"(nvidia-smi -r) with no process on it, or keep its MIG mode fixed")
            return True

    def create(self, gpu_uuid: str, gi_profile_id: int, start: int, size: int, profile: str) -> MigDevice:
        """Make a GPU instance of `gi_profile_id` at (`start`, `size`) and one compute instance over it;
        the new MIG device. Nothing is left behind when it fails."""
        gi_id = self.create_gpu_instance(gpu_uuid, gi_profile_id, start, size, profile)
        try:
            return self.create_compute_instance(gpu_uuid, gi_id, gi_profile_id, profile)
        except MigControlError:
            with contextlib.suppress(MigControlError):
                self.destroy_gpu_instance(gpu_uuid, gi_id)
            raise

    def create_gpu_instance(self, gpu_uuid: str, gi_profile_id: int, start: int, size: int,
                            profile: str) -> int:
        """Make a GPU instance of `gi_profile_id` at (`start`, `size`); its id."""
        where = f"{profile} at memory slices {start}..{start + size - 1}"
        with self._session:
            handle, _ = self._gpu(gpu_uuid)
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, size
            try:
                gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, gi_profile_id,
                                                                     ctypes.byref(placement))
                return int(pynvml.nvmlGpuInstanceGetInfo(gi).id)
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, f"create the GPU instance {where}", e) from None

    def create_compute_instance(self, gpu_uuid: str, gi_id: int, gi_profile_id: int,
                                profile: str) -> MigDevice:
        """Make the compute instance spanning GPU instance `gi_id`; the MIG device it makes. A failure
        leaves the GPU instance as it was (the caller's record says whose it is)."""
        what = f"the compute instance of the {profile} GPU instance {gi_id}"
        with self._session:
            handle, index = self._gpu(gpu_uuid)
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
                ci_profile = self._ci_profile(handle, gi, gi_profile_id)
                ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
                ci_info = pynvml.nvmlComputeInstanceGetInfo(ci)
                made = [m for m in read_mig_devices(index, gpu_uuid, handle)
                        if m.gi_id == gi_id and m.ci_id == int(ci_info.id)]
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, f"create {what}", e) from None
            if not made:
                raise MigControlError(f"GPU {gpu_uuid}: NVML made {what} but lists no MIG device for it; "
                                      "the driver may need an update")
            return made[0]

    def gpu_instances(self, gpu_uuid: str) -> tuple[GpuInstance, ...]:
        """Every GPU instance of the GPU, those without a compute instance too (empty while MIG mode is
        off): what a crash between the two creates leaves is found here."""
        with self._session:
            handle, index = self._gpu(gpu_uuid)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
                if current != pynvml.NVML_DEVICE_MIG_ENABLE:
                    return ()
                uuids: dict[int, list[str]] = {}
                for mig in read_mig_devices(index, gpu_uuid, handle):
                    uuids.setdefault(mig.gi_id, []).append(mig.uuid)
                found = []
                for gi in _gpu_instances(handle):
                    info = pynvml.nvmlGpuInstanceGetInfo(gi)
                    found.append(GpuInstance(gi_id=int(info.id), gi_profile_id=int(info.profileId),
                                             start=int(info.placement.start), size=int(info.placement.size),
                                             mig_uuids=tuple(uuids.get(int(info.id), ()))))
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, "list the GPU instances", e) from None
            return tuple(sorted(found, key=lambda g: (g.start, g.gi_id)))

    def destroy_gpu_instance(self, gpu_uuid: str, gi_id: int) -> None:
        """Destroy GPU instance `gi_id` with its compute instances; one already gone is no error. The
        caller has made sure by what NVML says of it that it is the one to destroy."""
        with self._session:
            handle, _ = self._gpu(gpu_uuid)
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            except pynvml.NVMLError as e:
                if e.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    return
                raise self._error(gpu_uuid, f"find GPU instance {gi_id}", e) from None
            try:
                for ci in _compute_instances(gi):
                    pynvml.nvmlComputeInstanceDestroy(ci)
                pynvml.nvmlGpuInstanceDestroy(gi)
            except pynvml.NVMLError as e:
                raise self._error(gpu_uuid, f"destroy GPU instance {gi_id}", e) from None

    # --- helpers -----------------------------------------------------------------------------------

    def _gpu(self, gpu_uuid: str) -> tuple[Any, int]:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
            return handle, int(pynvml.nvmlDeviceGetIndex(handle))
        except pynvml.NVMLError as e:
            raise self._error(gpu_uuid, "find the GPU", e) from None

    def _ci_profile(self, handle: Any, gi: Any, gi_profile_id: int) -> int:
        """The compute-instance profile spanning the whole GPU instance: the one with its slice count."""
        slices = _gi_slices(handle, gi_profile_id)
        for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except pynvml.NVMLError:
                continue  # a profile this GPU instance cannot hold
            if int(info.sliceCount) == slices:
                return int(info.id)
        raise MigControlError(f"NVML offers no compute-instance profile of {slices} slices for GPU-instance "
                              f"profile {gi_profile_id}; the driver may need an update")

    @staticmethod
    def _error(gpu_uuid: str, what: str, e: pynvml.NVMLError) -> MigControlError:
        name = error_name(e.value)
        if e.value in _TAKEN:
            fix = ("another MIG device holds those memory slices or the GPU's share of that profile (made "
                   "with nvidia-smi mig or a MIG manager behind the DRA plugin); delete it (nvidia-smi mig "
                   "-dci / -dgi) or let the scheduler place the claim elsewhere after the plugin republishes")
        elif e.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            fix = ("MIG mode must be on for this GPU (nvidia-smi -i <gpu> -mig 1) and the driver must "
                   "support MIG")
        elif e.value == pynvml.NVML_ERROR_NO_PERMISSION:
            fix = "the DRA plugin needs CAP_SYS_ADMIN to manage MIG (the chart's DRA plugin runs privileged)"
        elif e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            fix = "the GPU fell off the bus: reset it or reboot the node"
        else:
            fix = "check the GPU with nvidia-smi and the kernel log"
        return MigControlError(f"GPU {gpu_uuid}: cannot {what}: NVML answered {name} ({e}); {fix}",
                               taken=e.value in _TAKEN)


def _gi_slices(handle: Any, gi_profile_id: int) -> int:
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except pynvml.NVMLError:
            continue
        if int(info.id) == gi_profile_id:
            return int(info.sliceCount)
    raise MigControlError(f"NVML lists no GPU-instance profile with id {gi_profile_id} on this GPU")


def _compute_instances(gi: Any) -> list[Any]:
    found: list[Any] = []
    for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        slots = (pynvml.c_nvmlComputeInstance_t * 8)()
        count = ctypes.c_uint(0)
        try:
            pynvml.nvmlGpuInstanceGetComputeInstances(gi, profile, slots, ctypes.byref(count))
        except pynvml.NVMLError:
            continue
        found += [slots[i] for i in range(count.value)]
    return found


def _gpu_instances(handle: Any) -> list[Any]:
    found: list[Any] = []
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except pynvml.NVMLError:
            continue  # a profile this GPU does not offer
        slots = (pynvml.c_nvmlGpuInstance_t * max(1, int(info.instanceCount)))()
        count = ctypes.c_uint(0)
        try:
            pynvml.nvmlDeviceGetGpuInstances(handle, int(info.id), slots, ctypes.byref(count))
        except pynvml.NVMLError:
            continue
        found += [slots[i] for i in range(count.value)]
    return found
