"""Each holder's use of its device: its processes there, found by pod UID and container. Plain data.

A process counts for the holder of its device whose pod UID is the process's and whose container is
the one the process runs in (by name, from its mounts). Where the process's container cannot be told
and its pod holds the device in several containers (or through several claims), the first of them
gets it, so that no process is counted twice. A process that is no holder's (another pod's that sees
the GPU without holding it, a container of the pod that does not hold it, the MPS server, a host
process) is counted in `others` only.
A holder with no process on its device uses 0 bytes and 0 % (None % on a MIG device, where NVML has
no per-process utilization).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nvdp.inventory.processes import DeviceProcesses
from nvdp.usage.model import DeviceInfo, Holder, Owner, Use


def attribute(devices: Sequence[DeviceProcesses], infos: Mapping[str, DeviceInfo], holders: Sequence[Holder],
              owners: Mapping[int, Owner]) -> tuple[tuple[Use, ...], tuple[tuple[DeviceInfo, int], ...]]:
    """A Use per holder of a read device, in the order of `devices` then `holders`; and per device the
    number of processes that are no holder's (devices with none left out)."""
    uses: list[Use] = []
    others: list[tuple[DeviceInfo, int]] = []
    for device in devices:
        info = infos.get(device.uuid)
        on_device = [h for h in holders if h.device == device.uuid]
        if info is None or (not on_device and not device.processes):
            continue
        by_pod: dict[str, list[int]] = {}
        for n, holder in enumerate(on_device):
            if holder.pod_uid:
                by_pod.setdefault(holder.pod_uid, []).append(n)
        memory = dict.fromkeys(range(len(on_device)), 0)
        util = dict.fromkeys(range(len(on_device)), 0)
        count = dict.fromkeys(range(len(on_device)), 0)
        unclaimed = 0
        for process in device.processes:
            found = _holder_of(on_device, by_pod, owners.get(process.pid))
            if found is None:
                unclaimed += 1
                continue
            memory[found] += process.memory_bytes or 0
            util[found] += process.sm_util or 0
            count[found] += 1
        for n, holder in enumerate(on_device):
            uses.append(Use(device=info, holder=holder, memory_bytes=memory[n],
                            sm_util=util[n] if device.utilization else None, processes=count[n]))
        if unclaimed:
            others.append((info, unclaimed))
    return tuple(uses), tuple(others)


def _holder_of(on_device: Sequence[Holder], by_pod: Mapping[str, list[int]],
               owner: Owner | None) -> int | None:
    if owner is None:
        return None
    chosen = by_pod.get(owner.pod_uid, [])
    if owner.container:
        chosen = [k for k in chosen if on_device[k].container == owner.container]
    return chosen[0] if chosen else None
