"""The GPU feature discovery label set: Inventory + the node's Plan -> {label key: value}.

Keys and value formats are NVIDIA's gpu-feature-discovery's, so nodeSelectors written for it keep
working. Replicas and sharing come from the same Plan the plugin serves, so the labels cannot
disagree with what the node advertises. Where NVIDIA's result depends on Go's map order (a node
with two GPU models, or two MIG parents of one profile) we pick deterministically: whole GPUs over
MIG-enabled ones, then the model with the most GPUs, then the lowest GPU index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from msgspec import Struct

from nvdp.config.model import MigStrategy
from nvdp.health.state import Summary
from nvdp.inventory.model import Gpu, Inventory, MigDevice
from nvdp.plan.model import Plan, PlannedResource

PREFIX = "nvidia.com/"
TIMESTAMP = PREFIX + "gfd.timestamp"
MPS_CAPABLE = PREFIX + "mps.capable"
GPU_PRESENT = PREFIX + "gpu.present"  # the presence check's label, not part of the NVML label set
UNHEALTHY = PREFIX + "gpu.unhealthy"  # ours, from the plugin's health record
NEEDS_SERVICE = PREFIX + "gpu.needs-service"
UNKNOWN = "unknown"
MAX_LABEL_VALUE = 63

_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9\-_. ]")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")

# compute capability major -> family; 7 and 8 split on the minor version.
_FAMILIES = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell",
             12: "blackwell", 13: "rubin"}  # fmt: skip


class LabelError(ValueError):
    """The node's facts cannot be turned into labels (an unreadable driver version, ...)."""


class VgpuHost(Struct, frozen=True):
    """Whether this node's GPUs are vGPUs, and the host's vGPU manager they report ("" unknown)."""

    present: bool
    host_driver_version: str = ""
    host_driver_branch: str = ""


class HostFacts(Struct, frozen=True):
    """What the labels need from outside NVML: read from sysfs and the health record at the edge."""

    machine: str = UNKNOWN  # DMI product name
    gpu_mode: str = UNKNOWN  # "compute" (PCI 3D controller), "graphics" (VGA) or "unknown"
    vgpu: VgpuHost | None = None  # None: the PCI configuration could not be read (no vGPU labels)
    health: Summary | None = None  # None: no health record to read (no health labels)


UNKNOWN_HOST = HostFacts()


def sanitise(text: str) -> str:
    """NVIDIA's rule: drop characters outside [A-Za-z0-9-_. ], join the words with '-'.

    Ours on top: a Kubernetes label value is at most 63 characters and starts and ends with an
    alphanumeric, so longer or oddly-edged names are cut to fit instead of making the patch fail.
    """
    value = "-".join(_NOT_ALLOWED.sub("", text).split())
    return _EDGE.sub("", value[:MAX_LABEL_VALUE])


def family(major: int, minor: int) -> str:
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return _FAMILIES.get(major, "undefined")


def mig_resource_profile(profile: str) -> str:
    """NVIDIA's MIG name in labels and resource names: '+' becomes '.' ("1g.10gb+me" -> "1g.10gb.me")."""
    return profile.replace("+", ".")


def gpu_mode_from_pci_class(pci_class: str) -> str:
    """sysfs `class` of the PCI function (0x030200: 3D controller, 0x030000: VGA)."""
    return {"0x030200": "compute", "0x030000": "graphics"}.get(pci_class.strip().lower(), UNKNOWN)


class _Sharing(Struct, frozen=True):
    replicas: int
    strategy: str
    renamed: bool

    @property
    def shared(self) -> bool:
        return self.replicas > 1


_UNSHARED = _Sharing(1, "none", False)
_NO_SHARING = _Sharing(0, "none", False)  # NVIDIA's "sharing disabled": MIG-enabled GPUs, invalid MIG


def _sharing_of(plan: Plan, device_ids: Iterable[str]) -> _Sharing:
    """How the first of `device_ids` that the plan advertises is shared (ids are GPU or MIG UUIDs)."""
    owners: dict[str, PlannedResource] = {d.base_id: r for r in plan.resources for d in r.devices}
    for device_id in device_ids:
        resource = owners.get(device_id)
        if resource is not None:
            if resource.sharing == "none" or resource.replicas <= 1:
                return _UNSHARED
            renamed = bool(resource.source_name) and resource.name != resource.source_name
            return _Sharing(resource.replicas, resource.sharing, renamed)
    return _UNSHARED


def _resource_labels(key: str, product_parts: Iterable[str], count: int, sharing: _Sharing) -> dict[str, str]:
    parts = [sanitise(p) for p in product_parts if p]
    if sharing.shared and not sharing.renamed:
        parts.append("SHARED")
    product = sanitise("-".join(p for p in parts if p))
    return {
        f"{key}.product": product,
        f"{key}.count": str(count),
        f"{key}.replicas": str(sharing.replicas),
        f"{key}.sharing-strategy": sharing.strategy if sharing.shared else "none",
    }


def _mig_attribute_labels(key: str, mig: MigDevice) -> dict[str, str]:
    a = mig.attributes
    if a is None:
        return {f"{key}.memory": str(mig.memory_bytes // 2**20)}
    return {
        f"{key}.memory": str(a.memory_mib),
        f"{key}.multiprocessors": str(a.multiprocessors),
        f"{key}.slices.gi": str(a.slices_gi),
        f"{key}.slices.ci": str(a.slices_ci),
        f"{key}.engines.copy": str(a.engines_copy),
        f"{key}.engines.decoder": str(a.engines_decoder),
        f"{key}.engines.encoder": str(a.engines_encoder),
        f"{key}.engines.jpeg": str(a.engines_jpeg),
        f"{key}.engines.ofa": str(a.engines_ofa),
    }


def version_labels(inventory: Inventory) -> dict[str, str]:
    driver = inventory.driver_version
    parts = driver.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise LabelError(f"driver version {driver!r} does not match the format X.Y[.Z]")
    major, minor, rev = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
    cuda_major, _, cuda_minor = inventory.cuda_driver_version.partition(".")
    if not (cuda_major.isdigit() and cuda_minor.isdigit()):
        raise LabelError(f"CUDA driver version {inventory.cuda_driver_version!r} is not 'major.minor'")
    cuda_major, cuda_minor = str(int(cuda_major)), str(int(cuda_minor))
    return {
        # The old names, which NVIDIA still writes next to the new ones.
        PREFIX + "cuda.driver.major": major,
        PREFIX + "cuda.driver.minor": minor,
        PREFIX + "cuda.driver.rev": rev,
        PREFIX + "cuda.runtime.major": cuda_major,
        PREFIX + "cuda.runtime.minor": cuda_minor,
        PREFIX + "cuda.driver-version.major": major,
        PREFIX + "cuda.driver-version.minor": minor,
        PREFIX + "cuda.driver-version.revision": rev,
        PREFIX + "cuda.driver-version.full": driver,
        PREFIX + "cuda.runtime-version.major": cuda_major,
        PREFIX + "cuda.runtime-version.minor": cuda_minor,
        PREFIX + "cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }


def _by_model(gpus: Iterable[Gpu]) -> dict[str, list[Gpu]]:
    models: dict[str, list[Gpu]] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        models.setdefault(gpu.name, []).append(gpu)
    return models


def _full_gpu_labels(inventory: Inventory, plan: Plan | None) -> dict[str, str]:
    models = _by_model(inventory.gpus)
    # NVIDIA: labels of whole (MIG-disabled) GPUs win over those of MIG-enabled ones.
    candidates = [
        (not any(not g.mig_enabled for g in gpus), -len(gpus), gpus[0].index, name)
        for name, gpus in models.items()
    ]
    _, _, _, name = min(candidates)
    gpus = models[name]
    whole = [g for g in gpus if not g.mig_enabled]
    if whole and plan is not None:
        sharing = _sharing_of(plan, (g.uuid for g in whole))
    else:
        sharing = _NO_SHARING if not whole else _UNSHARED
    first = whole[0] if whole else gpus[0]
    key = PREFIX + "gpu"
    labels = _resource_labels(key, [name], len(gpus), sharing)
    memory_mib = first.memory_bytes // 2**20
    if memory_mib:
        labels[f"{key}.memory"] = str(memory_mib)
    major, minor = first.compute_capability
    if major:
        labels[f"{key}.family"] = family(major, minor)
        labels[f"{key}.compute.major"] = str(major)
        labels[f"{key}.compute.minor"] = str(minor)
    return labels


def single_strategy_problem(inventory: Inventory) -> str | None:
    """Why migStrategy single cannot label this node's MIG devices (NVIDIA's checks), or None."""
    mig_on = [g for g in inventory.gpus if g.mig_enabled]
    if not mig_on:
        return None
    if any(not g.mig_devices for g in mig_on):
        return "at least one MIG device is enabled but empty"
    if any(not g.mig_enabled for g in inventory.gpus):
        return "devices with MIG enabled and disabled detected"
    if len({m.profile for g in mig_on for m in g.mig_devices}) != 1:
        return "more than one MIG device type present on node"
    return None


def _mig_devices(inventory: Inventory) -> list[tuple[Gpu, MigDevice]]:
    return [
        (g, m)
        for g in sorted(inventory.gpus, key=lambda g: g.index)
        for m in sorted(g.mig_devices, key=lambda m: m.index)
        if g.mig_enabled
    ]


def _single_labels(inventory: Inventory, plan: Plan | None) -> dict[str, str]:
    mig_on = sorted((g for g in inventory.gpus if g.mig_enabled), key=lambda g: g.index)
    if not mig_on:
        return {}  # nothing to split: same as strategy none
    key = PREFIX + "gpu"
    if single_strategy_problem(inventory) is not None:
        labels = _resource_labels(key, [mig_on[0].name, "MIG", "INVALID"], 0, _NO_SHARING)
        labels[f"{key}.memory"] = "0"
        labels[f"{key}.sharing-strategy"] = ""  # NVIDIA's invalid set writes it empty, not "none"
        return labels
    migs = _mig_devices(inventory)
    parent, first = migs[0]
    sharing = _sharing_of(plan, (m.uuid for _, m in migs)) if plan is not None else _UNSHARED
    labels = _resource_labels(
        key, [parent.name, "MIG", mig_resource_profile(first.profile)], len(migs), sharing
    )
    labels.update(_mig_attribute_labels(key, first))
    return labels


def _mixed_labels(inventory: Inventory, plan: Plan | None) -> dict[str, str]:
    profiles: dict[str, list[tuple[Gpu, MigDevice]]] = {}
    for gpu, mig in _mig_devices(inventory):
        profiles.setdefault(mig_resource_profile(mig.profile), []).append((gpu, mig))
    labels: dict[str, str] = {}
    for profile, members in sorted(profiles.items()):
        parent, first = members[0]
        key = f"{PREFIX}mig-{profile}"
        sharing = _sharing_of(plan, (m.uuid for _, m in members)) if plan is not None else _UNSHARED
        labels.update(_resource_labels(key, [parent.name, "MIG", profile], len(members), sharing))
        labels.update(_mig_attribute_labels(key, first))
    return labels


def gfd_labels(
    inventory: Inventory,
    plan: Plan | None,
    mig_strategy: MigStrategy,
    host: HostFacts = UNKNOWN_HOST,
) -> dict[str, str]:
    """NVIDIA's GPU feature discovery label set for this node, without the timestamp.

    `plan` is the plan the plugin serves under the node's config, or None when that config cannot
    apply (the plugin then advertises nothing): resources are labelled unshared (MIG single: NVIDIA's
    `-MIG-INVALID` set) and mps.capable is false.
    """
    if not inventory.gpus:
        return {}
    labels: dict[str, str] = {PREFIX + "gpu.machine": sanitise(host.machine) or UNKNOWN}
    labels.update(version_labels(inventory))
    labels[PREFIX + "mig.capable"] = str(any(g.mig_capable for g in inventory.gpus)).lower()
    mps = plan is not None and any(r.sharing == "mps" and r.replicas > 1 for r in plan.resources)
    labels[MPS_CAPABLE] = str(mps and not any(g.mig_enabled for g in inventory.gpus)).lower()
    labels.update(_full_gpu_labels(inventory, plan))
    if mig_strategy != "none":
        labels[PREFIX + "mig.strategy"] = mig_strategy
        labels.update(
            _single_labels(inventory, plan) if mig_strategy == "single" else _mixed_labels(inventory, plan)
        )
    labels[PREFIX + "gpu.mode"] = host.gpu_mode
    labels.update(clique_labels(inventory))
    labels.update(vgpu_labels(host.vgpu))
    labels.update(health_labels(host.health))
    return labels


def health_labels(health: Summary | None) -> dict[str, str]:
    """Ours: `gpu.unhealthy` = GPUs the plugin holds down, `gpu.needs-service` = those of them that
    will not come back by themselves (a reset, a flapping GPU, recovery off); each absent at 0."""
    if health is None:
        return {}
    counts = ((UNHEALTHY, health.unhealthy), (NEEDS_SERVICE, health.needs_service))
    return {key: str(count) for key, count in counts if count}


def clique_labels(inventory: Inventory) -> dict[str, str]:
    """`gpu.clique` = <cluster UUID>.<clique id> of the NVLink fabric, when every GPU attached to one
    agrees on both (NVIDIA's rule; GPUs not attached are left out, disagreement gives no label)."""
    fabrics = [g.fabric for g in inventory.gpus if g.fabric is not None]
    clusters = {f.cluster_uuid for f in fabrics}
    cliques = {f.clique_id for f in fabrics}
    if len(clusters) != 1 or len(cliques) != 1:
        return {}
    return {PREFIX + "gpu.clique": f"{clusters.pop()}.{cliques.pop()}"}


def vgpu_labels(vgpu: VgpuHost | None) -> dict[str, str]:
    """`vgpu.present` always (NVIDIA's), the host's vGPU manager when a vGPU reports it; nothing when
    the PCI configuration could not be read, as NVIDIA."""
    if vgpu is None:
        return {}
    labels = {PREFIX + "vgpu.present": str(vgpu.present).lower()}
    if vgpu.present and (vgpu.host_driver_version or vgpu.host_driver_branch):
        # sanitised: the bytes come from the PCI configuration space
        labels[PREFIX + "vgpu.host-driver-version"] = sanitise(vgpu.host_driver_version)
        labels[PREFIX + "vgpu.host-driver-branch"] = sanitise(vgpu.host_driver_branch)
    return labels


def with_timestamp(labels: Mapping[str, str], now: int | None) -> dict[str, str]:
    """Add gfd.timestamp (unix seconds) unless `now` is None (noTimestamp)."""
    out = dict(labels)
    if now is not None:
        out[TIMESTAMP] = str(now)
    return out
