"""The DRA devices of a node: what NVIDIA's DRA driver (v25.12) publishes for each GPU and MIG device.

A GPU with MIG enabled publishes its MIG devices, not itself. Attributes and capacities are in the API's
JSON form, ready for a ResourceSlice. Unprefixed names belong to the driver's own domain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from msgspec import Struct
from msgspec.structs import replace

from nvdp.config.model import SharingStrategy
from nvdp.dra.pool.names import gpu_device_name, mig_device_name
from nvdp.inventory.model import Gpu, Inventory, MigDevice
from nvdp.plan.model import Plan
from nvdp.plan.patterns import GPU_RESOURCE, mig_resource_name

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
# KEP-6072's standard attribute: a claim's `matchAttribute` constraint puts a GPU and another driver's
# device (a NIC) on one NUMA node. An int, as NVIDIA's driver publishes it without DRAListTypeAttributes.
NUMA_NODE = "resource.kubernetes.io/numaNode"
ADDRESSING_MODE = "addressingMode"
RESOURCE_ATTRIBUTE = "resource"
MIB = 1024 * 1024
# Masterminds/semver's loose form, which NVIDIA's driver parses versions with.
_SEMVER = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")

Attributes = dict[str, dict[str, object]]
Capacity = dict[str, dict[str, str]]


class CounterSet(Struct, frozen=True):
    """One GPU's shared counters under migStrategy dynamic: a ResourceSlice's `sharedCounters` entry
    (nvdp.dra.pool.partitions)."""

    name: str  # "gpu-0-mig"
    counters: dict[str, int]


class Placement(Struct, frozen=True):
    """Where a dynamic MIG device's GPU instance goes when a claim's prepare makes it."""

    profile: str  # "3g.40gb"
    gi_profile_id: int  # what nvmlDeviceCreateGpuInstanceWithPlacement takes
    start: int  # first memory slice
    size: int  # memory slices


class DraDevice(Struct, frozen=True):
    name: str  # "gpu-0", "gpu-0-mig-1g10gb-19-0"
    kind: str  # "gpu" | "mig"
    uuid: str  # the GPU or MIG UUID
    gpu_uuid: str  # the physical GPU (== uuid for a full GPU)
    attributes: Attributes  # API JSON form: {"uuid": {"string": "GPU-..."}}
    capacity: Capacity  # {"memory": {"value": "16106127360"}}
    # From the node's plan (`with_plan`): the name the device plugin would advertise it under, and how
    # many claims may share it (the config's sharing.timeSlicing / sharing.mps replicas) and how.
    resource: str = ""
    replicas: int = 1
    sharing: SharingStrategy = "none"
    # Strict MPS shares (sharing.mps strictShares): its slice offers one share size, and every claim on
    # it gets exactly that as its enforced MPS limits (nvdp.dra.claims.sharing.strict).
    strict: bool = False
    # migStrategy dynamic (nvdp.dra.pool.partitions): the placement a MIG device is made at (uuid is ""
    # until then), and the counters of its GPU's counter set the device consumes.
    placement: Placement | None = None
    counter_set: CounterSet | None = None
    consumes: dict[str, int] = {}

    @property
    def shared(self) -> bool:
        return self.replicas > 1


def semver(version: str) -> str | None:
    """A version as semantic version 2.0, the way NVIDIA normalises it: "9.0" -> "9.0.0",
    "570.124.06" -> "570.124.6"; None when it is not a version at all."""
    m = _SEMVER.match(version.strip())
    if m is None:
        return None
    major, minor, patch, pre, build = m.groups()
    return f"{int(major)}.{int(minor or 0)}.{int(patch or 0)}{pre or ''}{build or ''}"


def pci_address(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" as the standard attribute wants it: "0000:3b:00.0"."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def dra_devices(inventory: Inventory) -> tuple[DraDevice, ...]:
    """Every device the node publishes, GPUs in minor order, MIG devices in placement order per GPU.

    A GPU instance split into several compute instances would give its devices one name; only the
    first is published, as NVIDIA's driver serves one compute instance per GPU instance.
    """
    devices: list[DraDevice] = []
    seen: set[str] = set()
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        common = common_attributes(gpu, inventory)
        if not gpu.mig_enabled:
            devices.append(gpu_device(gpu, common))
            continue
        for mig in sorted(gpu.mig_devices, key=_placement_order):
            device = _mig_device(gpu, mig, common)
            if device.name not in seen:
                seen.add(device.name)
                devices.append(device)
    return tuple(devices)


def with_plan(devices: Iterable[DraDevice], plan: Plan) -> tuple[DraDevice, ...]:
    """The devices with what the node's plan says of them: the `resource` attribute (the name the
    device plugin advertises the device under with this config, which extended-resource DeviceClasses
    select on), and the replicas, sharing strategy and strict MPS shares of that resource.

    A device the plan leaves out (migStrategy none advertises a MIG-enabled GPU whole, or a pattern
    matches nothing) keeps NVIDIA's default name (nvidia.com/gpu, nvidia.com/mig-<profile>) unshared.
    """
    planned: dict[str, tuple[str, int, SharingStrategy, bool]] = {}
    for resource in plan.resources:
        for entry in resource.devices:
            planned.setdefault(entry.base_id, (resource.name, resource.replicas, resource.sharing,
                                               resource.strict_shares))
    out = []
    for device in devices:
        unplanned = (_default_resource(device), 1, "none", False)
        name, replicas, sharing, strict = planned.get(device.uuid, unplanned)
        if replicas <= 1:
            replicas, sharing = 1, "none"
        strict = strict and sharing == "mps" and device.kind == "gpu"
        attributes = {**device.attributes, RESOURCE_ATTRIBUTE: {"string": name}}
        out.append(replace(device, attributes=attributes, resource=name, replicas=replicas, sharing=sharing,
                           strict=strict))
    return tuple(out)


def _default_resource(device: DraDevice) -> str:
    if device.kind == "mig":
        return mig_resource_name(str(device.attributes.get("profile", {}).get("string", "")))
    return GPU_RESOURCE


def by_name(devices: Iterable[DraDevice]) -> dict[str, DraDevice]:
    """The devices keyed by their DRA device name."""
    return {d.name: d for d in devices}


def _placement_order(mig: MigDevice) -> tuple[int, int]:
    return (mig.placement_start if mig.placement_start is not None else mig.gi_id, mig.index)


def common_attributes(gpu: Gpu, inventory: Inventory) -> Attributes:
    """What a GPU and its MIG devices share: product, versions, PCI placement, addressing mode."""
    attrs: Attributes = {"productName": {"string": gpu.name}}
    if gpu.brand:
        attrs["brand"] = {"string": gpu.brand}
    if gpu.architecture:
        attrs["architecture"] = {"string": gpu.architecture}
    versions = {
        "cudaComputeCapability": "{}.{}".format(*gpu.compute_capability),
        "driverVersion": inventory.driver_version,
        "cudaDriverVersion": inventory.cuda_driver_version,
    }
    for key, text in versions.items():
        version = semver(text)
        if version is not None:  # a version NVML did not report is left out rather than made up
            attrs[key] = {"version": version}
    attrs[PCI_BUS_ID] = {"string": pci_address(gpu.pci_bus_id)}
    if gpu.pcie_root is not None:
        attrs[PCIE_ROOT] = {"string": gpu.pcie_root}
    # The node the GPU's PCI device hangs off, from sysfs (nvdp.inventory.nvml.numa_node, what the device
    # plugin reports to the kubelet's topology manager); left out where sysfs has none.
    if gpu.numa_node is not None:
        attrs[NUMA_NODE] = {"int": gpu.numa_node}
    # "ATS" (GH200, GB200), "HMM", or "None" when supported but inactive; left out where NVML does not
    # support the call, as NVIDIA's driver does.
    if gpu.addressing_mode:
        attrs[ADDRESSING_MODE] = {"string": gpu.addressing_mode}
    return attrs


def gpu_device(gpu: Gpu, common: Attributes) -> DraDevice:
    attrs: Attributes = {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, **common}
    return DraDevice(
        name=gpu_device_name(gpu),
        kind="gpu",
        uuid=gpu.uuid,
        gpu_uuid=gpu.uuid,
        attributes=attrs,
        capacity={"memory": _quantity(gpu.memory_bytes)},
    )


def _mig_device(gpu: Gpu, mig: MigDevice, common: Attributes) -> DraDevice:
    attrs: Attributes = {
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": mig.profile},
        **common,
    }
    capacity: Capacity = {}
    a = mig.attributes
    if a is not None:
        engines = {
            "multiprocessors": a.multiprocessors,
            "copyEngines": a.engines_copy,
            "decoders": a.engines_decoder,
            "encoders": a.engines_encoder,
            "jpegEngines": a.engines_jpeg,
            "ofaEngines": a.engines_ofa,
        }
        capacity.update({key: _quantity(value) for key, value in engines.items()})
    # NVIDIA announces the profile's memory size (MiB) in bytes; NVML's memory total where it is not known
    memory = a.memory_mib * MIB if a is not None and a.memory_mib else mig.memory_bytes
    capacity["memory"] = _quantity(memory)
    if mig.placement_start is not None and mig.placement_size is not None:
        for i in range(mig.placement_start, mig.placement_start + mig.placement_size):
            capacity[f"memorySlice{i}"] = _quantity(1)
    return DraDevice(
        name=mig_device_name(gpu, mig),
        kind="mig",
        uuid=mig.uuid,
        gpu_uuid=gpu.uuid,
        attributes=attrs,
        capacity=capacity,
    )


def _quantity(value: int) -> dict[str, str]:
    return {"value": str(value)}
