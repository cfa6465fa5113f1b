"""Physical devices -> unshared resources, by MIG strategy and resource patterns (before sharing)."""

from __future__ import annotations

from msgspec import Struct, field

from nvdp.config.model import Config, ResourcePattern
from nvdp.inventory.model import Gpu, Inventory, MigDevice
from nvdp.plan.errors import PlanError
from nvdp.plan.model import Exclusion, PlannedDevice
from nvdp.plan.patterns import default_gpu_patterns, default_mig_patterns, describe, first_match


class BaseAllocation(Struct):
    """Unshared resources (name -> devices, in GPU/MIG index order), exclusions and warnings."""

    resources: dict[str, list[PlannedDevice]] = field(default_factory=dict)
    excluded: list[tuple[tuple[int, int], Exclusion]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, name: str, device: PlannedDevice) -> None:
        self.resources.setdefault(name, []).append(device)

    def exclude(self, order: tuple[int, int], device: str, reason: str) -> None:
        self.excluded.append((order, Exclusion(device=device, reason=reason)))


def gpu_device(gpu: Gpu) -> PlannedDevice:
    return PlannedDevice(
        id=gpu.uuid,
        base_id=gpu.uuid,
        index=str(gpu.index),
        gpu_uuids=(gpu.uuid,),
        gpu_indices=(gpu.index,),
        minors=(gpu.minor,),
        numa_node=gpu.numa_node,
        memory_bytes=gpu.memory_bytes,
    )


def mig_device(gpu: Gpu, mig: MigDevice) -> PlannedDevice:
    return PlannedDevice(
        id=mig.uuid,
        base_id=mig.uuid,
        index=mig.index_id,
        gpu_uuids=(gpu.uuid,),
        gpu_indices=(gpu.index,),
        minors=(gpu.minor,),
        numa_node=gpu.numa_node,
        memory_bytes=mig.memory_bytes,
        mig=(mig.gi_id, mig.ci_id),
    )


def _fix_empty_mig(gpu: Gpu) -> str:
    return (
        f"create MIG devices on it (for example `nvidia-smi mig -i {gpu.index} -cgi <profile> -C`, "
        f"or a mig-parted config) or disable MIG mode (`nvidia-smi -i {gpu.index} -mig 0`)"
    )


def _add_full_gpu(out: BaseAllocation, gpu: Gpu, patterns: tuple[ResourcePattern, ...]) -> None:
    match = first_match(patterns, gpu.name)
    if match is None:
        out.exclude(
            (gpu.index, -1),
            gpu.uuid,
            f"GPU name '{gpu.name}' does not match any resource patterns (resources.gpus: "
            f"{describe(patterns)}); add a resources.gpus entry whose pattern matches it",
        )
        return
    out.add(match.name, gpu_device(gpu))


def _add_mig_devices(out: BaseAllocation, gpu: Gpu, patterns: tuple[ResourcePattern, ...]) -> None:
    for mig in sorted(gpu.mig_devices, key=lambda m: m.index):
        match = first_match(patterns, mig.profile)
        if match is None:
            out.exclude(
                (gpu.index, mig.index),
                mig.uuid,
                f"MIG profile '{mig.profile}' does not match any resource patterns (resources.mig: "
                f"{describe(patterns)}); add a resources.mig entry whose pattern matches it",
            )
            continue
        out.add(match.name, mig_device(gpu, mig))


def _check_single(gpus: list[Gpu]) -> None:
    """NVIDIA's consistency rules for migStrategy single, in NVIDIA's order, each with its fix."""
    mig_gpus = [g for g in gpus if g.mig_enabled]
    if not mig_gpus:
        return
    empty = [g for g in mig_gpus if not g.mig_devices]
    if empty:
        gpu = empty[0]
        raise PlanError(
            "invalid MIG configuration: at least one device with migEnabled=true was not configured "
            f"correctly: device {gpu.index} ({gpu.uuid}) has no MIG devices configured; "
            f"{_fix_empty_mig(gpu)}"
        )
    profiles = sorted({m.profile for g in mig_gpus for m in g.mig_devices})
    if len(profiles) > 1:
        raise PlanError(
            "invalid MIG configuration: more than one MIG device type present on node "
            f"({', '.join(profiles)}); migStrategy single advertises every MIG device as "
            "nvidia.com/gpu, so all must have the same profile: repartition the GPUs to one profile "
            "or set migStrategy to mixed"
        )
    full = [g for g in gpus if not g.mig_enabled]
    if full:
        raise PlanError(
            "all devices on the node must be configured with the same migEnabled value (MIG enabled "
            f"on GPU {_indices(mig_gpus)}, disabled on GPU {_indices(full)}); enable MIG mode on "
            "every GPU, disable it on every GPU, or set migStrategy to mixed"
        )


def _indices(gpus: list[Gpu]) -> str:
    return ", ".join(str(g.index) for g in gpus)


def allocate_base(config: Config, inventory: Inventory) -> BaseAllocation:
    """Assign every readable physical device to an unshared resource or to the exclusions."""
    strategy = config.flags.mig_strategy
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    out = BaseAllocation()
    for lost in inventory.lost:
        out.exclude((lost.index, -1), lost.uuid or f"GPU {lost.index}", lost.reason)

    gpu_patterns = config.resources.gpus or default_gpu_patterns()
    if strategy == "none":
        # NVIDIA's documented behaviour: under `none` a MIG-enabled GPU is still advertised
        # as a whole GPU. We keep that (users rely on it while re-partitioning) but say that
        # such a GPU runs no CUDA work until its MIG devices are exposed.
        for gpu in gpus:
            _add_full_gpu(out, gpu, gpu_patterns)
        mig_on = [g for g in gpus if g.mig_enabled]
        if mig_on:
            out.warnings.append(
                f"MIG mode is enabled on GPU {_indices(mig_on)}; migStrategy none advertises "
                f"{'it as a whole GPU' if len(mig_on) == 1 else 'them as whole GPUs'}, which CUDA work "
                "cannot use while MIG mode is on: set migStrategy to single or mixed to advertise the MIG "
                f"devices, or disable MIG mode (`nvidia-smi -i {mig_on[0].index} -mig 0`)"
            )
        return out

    if strategy == "single":
        _check_single(gpus)
    profiles = [m.profile for g in gpus for m in g.mig_devices]
    mig_patterns = config.resources.mig or default_mig_patterns(strategy, profiles)
    for gpu in gpus:
        if not gpu.mig_enabled:
            _add_full_gpu(out, gpu, gpu_patterns)
        elif strategy == "dynamic":
            # The DRA plugin makes MIG devices when claims are prepared (nvdp.dra.pool.partitions): the
            # plan names no device of a MIG-capable GPU ahead of them.
            continue
        elif not gpu.mig_devices:
            # Only reachable under mixed (single raised above): NVIDIA warns and skips it.
            out.exclude(
                (gpu.index, -1),
                gpu.uuid,
                f"MIG mode is enabled but no MIG devices are configured; {_fix_empty_mig(gpu)}",
            )
        else:
            _add_mig_devices(out, gpu, mig_patterns)
    return out
