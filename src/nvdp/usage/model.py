"""The usage records: who holds a device, whose a process is, and one container's use of one device."""

from __future__ import annotations

from msgspec import Struct


class Holder(Struct, frozen=True):
    """A running container that holds a device, as the kubelet says, with its pod's UID where known."""

    device: str  # the GPU's or MIG device's UUID
    namespace: str  # the pod's
    pod: str
    container: str
    pod_uid: str = ""  # "" while not known: its processes cannot be told from other pods'
    resource: str = ""  # device plugin: the resource it was given the device under
    claim_namespace: str = ""  # DRA: the claim it holds the device through
    claim_name: str = ""
    driver: str = ""
    pool: str = ""
    device_name: str = ""  # the DRA device ("gpu-0")


class Owner(Struct, frozen=True):
    """Where a process runs: its pod and container, from its cgroup and mounts."""

    pod_uid: str
    container_id: str  # "" when the process is in the pod's cgroup but no container's
    container: str = ""  # the container's name; "" when its mounts do not say


class DeviceInfo(Struct, frozen=True):
    """What the series say about a device, in dcgm-exporter's terms."""

    uuid: str  # the GPU's or MIG device's
    gpu_uuid: str
    gpu_index: int
    minor: int  # /dev/nvidia<minor>
    model: str  # the GPU's name, "Tesla T4"
    mig_gi_id: int | None = None  # a MIG device's GPU instance id
    mig_profile: str = ""  # a MIG device's profile, "1g.10gb"


class Use(Struct, frozen=True):
    """One container's use of one device it holds: the sum over its processes there."""

    device: DeviceInfo
    holder: Holder
    memory_bytes: int
    sm_util: int | None  # percent; None where NVML gives no per-process figure (MIG)
    processes: int


class Usage(Struct, frozen=True):
    """One collection: a Use per holder of a device this node's plugin handed out (0 when it runs
    nothing there), the processes on each device that belong to no holder, and why figures are missing."""

    node: str
    uses: tuple[Use, ...] = ()
    others: tuple[tuple[DeviceInfo, int], ...] = ()  # (device, processes on it that are no holder's)
    problems: tuple[str, ...] = ()
