"""MIG instances made and destroyed through NVML, as `nvidia-smi mig -cgi ... -C` / `-dci` / `-dgi` do it.

Runs in a process whose NVML is the stand-in (`NodeSim.env`), so every change goes through the library's
own rules and state files, exactly as a plugin's would: `python -m sim.nvml.mig create|destroy|list|gis ...`
prints JSON; `NodeSim.mig_create`, `mig_destroy`, `mig_instances` and `gpu_instances` start it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from typing import Any

import pynvml as n

# NVML_COMPUTE_INSTANCE_PROFILE_* that spans a whole GPU instance of that many compute slices.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gi_profiles(handle: Any) -> list[Any]:
    profiles = []
    for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            profiles.append(n.nvmlDeviceGetGpuInstanceProfileInfo(handle, index))
        except n.NVMLError as e:
            if e.value not in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_INVALID_ARGUMENT):
                raise
    return profiles


def _placements(handle: Any, profile_id: int) -> list[tuple[int, int]]:
    function = n._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
    count = ctypes.c_uint(0)
    status = function(handle, profile_id, None, ctypes.byref(count))
    if status != n.NVML_SUCCESS:
        raise n.NVMLError(status)
    slots = (n.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    status = function(handle, profile_id, slots, ctypes.byref(count))
    if status != n.NVML_SUCCESS:
        raise n.NVMLError(status)
    return [(slots[k].start, slots[k].size) for k in range(count.value)]


def instances(gpu_uuid: str) -> list[dict[str, Any]]:
    """The GPU's MIG devices (a GI with its CI each) and GPU instances without a compute instance."""
    handle = n.nvmlDeviceGetHandleByUUID(gpu_uuid)
    if not n.nvmlDeviceGetMigMode(handle)[0]:
        return []
    found: list[dict[str, Any]] = []
    for j in range(n.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except n.NVMLError as e:
            if e.value == n.NVML_ERROR_NOT_FOUND:
                continue
            raise
        gi_id = int(n.nvmlDeviceGetGpuInstanceId(mig))
        entry: dict[str, Any] = {
            "gi_id": gi_id, "ci_id": int(n.nvmlDeviceGetComputeInstanceId(mig)), "gi_profile_id": None,
            "start": None, "size": None, "uuid": _text(n.nvmlDeviceGetUUID(mig)),
            "profile": _text(n.nvmlDeviceGetName(mig)).rpartition(" MIG ")[2],
        }  # fmt: skip
        try:
            info = n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(handle, gi_id))
            entry.update(gi_profile_id=int(info.profileId), start=int(info.placement.start),
                         size=int(info.placement.size))
        except n.NVMLError as e:
            if e.value != n.NVML_ERROR_NOT_SUPPORTED:  # a static GI of a size without a known profile
                raise
        found.append(entry)
    with_devices = {entry["gi_id"] for entry in found}
    for profile in _gi_profiles(handle):
        gis = (n.c_nvmlGpuInstance_t * max(profile.instanceCount, 1))()
        count = ctypes.c_uint(0)
        n.nvmlDeviceGetGpuInstances(handle, profile.id, gis, ctypes.byref(count))
        for k in range(count.value):
            info = n.nvmlGpuInstanceGetInfo(gis[k])
            if int(info.id) not in with_devices:
                found.append({
                    "gi_id": int(info.id), "ci_id": None, "gi_profile_id": int(info.profileId),
                    "start": int(info.placement.start), "size": int(info.placement.size), "uuid": None,
                    "profile": _text(profile.name).removeprefix("MIG "),
                })  # fmt: skip
    return found


def gpu_instances(gpu_uuid: str) -> list[dict[str, Any]]:
    """Every GPU instance of the GPU, with or without compute instances, found as a plugin finds what a
    crash left behind: nvmlDeviceGetGpuInstances per GI profile, nvmlGpuInstanceGetInfo, and
    nvmlGpuInstanceGetComputeInstances per CI profile. Sorted by GI id."""
    handle = n.nvmlDeviceGetHandleByUUID(gpu_uuid)
    if not n.nvmlDeviceGetMigMode(handle)[0]:
        return []
    found: list[dict[str, Any]] = []
    for profile in _gi_profiles(handle):
        gis = (n.c_nvmlGpuInstance_t * max(profile.instanceCount, 1))()
        count = ctypes.c_uint(0)
        n.nvmlDeviceGetGpuInstances(handle, profile.id, gis, ctypes.byref(count))
        for k in range(count.value):
            info = n.nvmlGpuInstanceGetInfo(gis[k])
            ci_ids: list[int] = []
            for ci_profile in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                cis = (n.c_nvmlComputeInstance_t * 8)()
                ci_count = ctypes.c_uint(0)
                n.nvmlGpuInstanceGetComputeInstances(gis[k], ci_profile, cis, ctypes.byref(ci_count))
                ci_ids += [int(n.nvmlComputeInstanceGetInfo(cis[c]).id) for c in range(ci_count.value)]
            found.append({
                "gi_id": int(info.id), "gi_profile_id": int(info.profileId),
                "profile": _text(profile.name).removeprefix("MIG "), "start": int(info.placement.start),
                "size": int(info.placement.size), "ci_ids": sorted(ci_ids),
            })  # fmt: skip
    return sorted(found, key=lambda entry: int(entry["gi_id"]))


def create(gpu_uuid: str, gi_profile_id: int, start: int) -> str:
    """A GPU instance of the profile at `start` plus one compute instance spanning it; its MIG UUID."""
    handle = n.nvmlDeviceGetHandleByUUID(gpu_uuid)
    profile = next((p for p in _gi_profiles(handle) if p.id == gi_profile_id), None)
    if profile is None:
        raise n.NVMLError(n.NVML_ERROR_INVALID_ARGUMENT)
    sizes = {size for _, size in _placements(handle, gi_profile_id)}
    placement = n.c_nvmlGpuInstancePlacement_t(start, min(sizes) if sizes else 1)
    gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(handle, gi_profile_id, ctypes.byref(placement))
    try:
        ci = n.nvmlGpuInstanceCreateComputeInstance(gi, CI_PROFILE_BY_SLICES[int(profile.sliceCount)])
    except n.NVMLError:
        n.nvmlGpuInstanceDestroy(gi)
        raise
    gi_id, ci_id = int(n.nvmlGpuInstanceGetInfo(gi).id), int(n.nvmlComputeInstanceGetInfo(ci).id)
    for entry in instances(gpu_uuid):
        if entry["gi_id"] == gi_id and entry["ci_id"] == ci_id:
            return str(entry["uuid"])
    raise n.NVMLError(n.NVML_ERROR_UNKNOWN)


def destroy(gpu_uuid: str, gi_id: int) -> None:
    """The GPU instance's compute instances, then the GPU instance."""
    handle = n.nvmlDeviceGetHandleByUUID(gpu_uuid)
    gi = n.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    for profile in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        cis = (n.c_nvmlComputeInstance_t * 8)()
        count = ctypes.c_uint(0)
        n.nvmlGpuInstanceGetComputeInstances(gi, profile, cis, ctypes.byref(count))
        for k in range(count.value):
            n.nvmlComputeInstanceDestroy(cis[k])
    n.nvmlGpuInstanceDestroy(gi)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.nvml.mig", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("create", "destroy", "list", "gis"):
        command = sub.add_parser(name)
        command.add_argument("--uuid", required=True)
        if name == "create":
            command.add_argument("--gi-profile", type=int, required=True)
            command.add_argument("--start", type=int, required=True)
        if name == "destroy":
            command.add_argument("--gi-id", type=int, required=True)
    args = parser.parse_args(argv)
    n.nvmlInit()
    try:
        if args.command == "create":
            result: Any = create(args.uuid, args.gi_profile, args.start)
        elif args.command == "destroy":
            destroy(args.uuid, args.gi_id)
            result = None
        elif args.command == "gis":
            result = gpu_instances(args.uuid)
        else:
            result = instances(args.uuid)
    except n.NVMLError as e:
        print(json.dumps({"error": str(e), "code": e.value}))
        return 1
    finally:
        n.nvmlShutdown()
    print(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
