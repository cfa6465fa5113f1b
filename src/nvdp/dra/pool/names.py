"""Names the DRA driver publishes: the driver name and NVIDIA's device names (k8s-dra-driver-gpu v25.12)."""

from __future__ import annotations

import re

from nvdp.config.names import DEFAULT_DRA_DRIVER
from nvdp.inventory.model import Gpu, Inventory, MigDevice

DEFAULT_DRIVER = DEFAULT_DRA_DRIVER
MAX_DRIVER_NAME = 26
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NOT_RFC1123 = re.compile(r"[^a-z0-9.-]")
_GPU_NAME = re.compile(r"^gpu-\d+$")
_MIG_NAME = re.compile(r"^gpu-\d+-mig-")


def check_driver_name(name: str) -> str | None:
    """None when `name` can be the driver name; else what is wrong with it and the fix."""
    if not name:
        return f"the DRA driver name is empty; use a DNS subdomain such as {DEFAULT_DRIVER}"
    if len(name) > MAX_DRIVER_NAME:
        return (
            f"the DRA driver name {name!r} has {len(name)} characters, at most {MAX_DRIVER_NAME} are "
            f"allowed; choose a shorter DNS subdomain such as {DEFAULT_DRIVER}"
        )
    if not _DNS_SUBDOMAIN.match(name):
        return (
            f"the DRA driver name {name!r} is not a lower-case DNS subdomain (a-z, 0-9, '-' and '.', "
            f"starting and ending with a letter or digit); use one such as {DEFAULT_DRIVER}"
        )
    return None


def rfc1123(name: str) -> str:
    """NVIDIA's toRFC1123Compliant: lower case, other characters than [a-z0-9-.] become '-', trimmed."""
    name = _NOT_RFC1123.sub("-", name.lower()).strip("-").removesuffix(".")
    return name[:253]


def gpu_device_name(gpu: Gpu) -> str:
    """A full GPU: "gpu-<minor>" (NVIDIA names devices by the /dev/nvidia<minor> number)."""
    return f"gpu-{gpu.minor}"


def mig_device_name(gpu: Gpu, mig: MigDevice) -> str:
    """A MIG device: "gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>", the profile
    without dots and RFC 1123 compliant ("1g.10gb+me" -> "1g10gb-me"), e.g. "gpu-0-mig-1g10gb-19-0".

    Without the GPU instance facts (NVML that could not read them) the GPU and compute instance ids
    stand in: "gpu-0-mig-1g10gb-gi7-ci0".
    """
    if mig.gi_profile_id is None or mig.placement_start is None:
        return f"gpu-{gpu.minor}-mig-{rfc1123(mig.profile.replace('.', ''))}-gi{mig.gi_id}-ci{mig.ci_id}"
    return placement_device_name(gpu, mig.profile, mig.gi_profile_id, mig.placement_start)


def placement_device_name(gpu: Gpu, profile: str, gi_profile_id: int, start: int) -> str:
    """The MIG device of `profile` at placement `start`, made or not (migStrategy dynamic publishes it
    before it exists): "gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>"."""
    return f"gpu-{gpu.minor}-mig-{rfc1123(profile.replace('.', ''))}-{gi_profile_id}-{start}"


def device_kind(name: str) -> str:
    """The kind of a device named in the forms above, "gpu" or "mig"; "unknown" for any other name."""
    if _GPU_NAME.match(name):
        return "gpu"
    return "mig" if _MIG_NAME.match(name) else "unknown"


def device_uuids(inventory: Inventory) -> dict[str, str]:
    """The name of every GPU and MIG device of `inventory` as this driver publishes it, with its UUID
    (what a claim's device name stands for on this node; nvdp.usage counts claims' use by it)."""
    names: dict[str, str] = {}
    for gpu in inventory.gpus:
        names[gpu_device_name(gpu)] = gpu.uuid
        for mig in gpu.mig_devices:
            names[mig_device_name(gpu, mig)] = mig.uuid
    return names
