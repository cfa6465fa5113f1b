"""Small builders for inventories and configs used across the plan tests."""

from __future__ import annotations

from nvdp.config.model import (
    Config,
    DeviceSelection,
    Flags,
    MigStrategy,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
    Resources,
    Sharing,
)
from nvdp.inventory.model import Gpu, Inventory, LostGpu, MigDevice

GIB = 1024**3


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def mig_uuid(gpu: int, mig: int) -> str:
    return f"MIG-{gpu:04d}{mig:04d}-0000-0000-0000-000000000000"


def mig(gpu: int, index: int, profile: str = "1g.10gb", gi: int | None = None, ci: int = 0) -> MigDevice:
    return MigDevice(
        uuid=mig_uuid(gpu, index),
        index=index,
        parent_uuid=gpu_uuid(gpu),
        parent_index=gpu,
        profile=profile,
        gi_id=index + 1 if gi is None else gi,
        ci_id=ci,
        memory_bytes=10 * GIB,
    )


def gpu(
    index: int,
    name: str = "Tesla T4",
    cc: tuple[int, int] = (7, 5),
    mig_profiles: tuple[str, ...] | None = None,
    numa: int | None = 0,
) -> Gpu:
    """A GPU; `mig_profiles` not None means MIG enabled with one MIG device per profile given."""
    migs = tuple(mig(index, j, p) for j, p in enumerate(mig_profiles or ()))
    return Gpu(
        index=index,
        uuid=gpu_uuid(index),
        name=name,
        memory_bytes=16 * GIB,
        compute_capability=cc,
        minor=index,
        pci_bus_id=f"00000000:{index + 1:02x}:00.0",
        numa_node=numa,
        mig_capable=mig_profiles is not None,
        mig_enabled=mig_profiles is not None,
        mig_devices=migs,
    )


def inventory(*gpus: Gpu, lost: tuple[LostGpu, ...] = ()) -> Inventory:
    return Inventory(driver_version="550.54.15", cuda_driver_version="12.4", gpus=gpus, lost=lost)


def entry(
    name: str = "nvidia.com/gpu",
    replicas: int = 10,
    rename: str | None = None,
    devices: DeviceSelection | None = None,
) -> ReplicatedResource:
    return ReplicatedResource(
        name=name, replicas=replicas, rename=rename, devices=devices or DeviceSelection()
    )


def config(
    mig_strategy: MigStrategy = "none",
    time_slicing: tuple[ReplicatedResource, ...] | None = None,
    mps: tuple[ReplicatedResource, ...] | None = None,
    fail_gt1: bool = False,
    gpus: tuple[ResourcePattern, ...] = (),
    migs: tuple[ResourcePattern, ...] = (),
) -> Config:
    return Config(
        flags=Flags(mig_strategy=mig_strategy),
        resources=Resources(gpus=gpus, mig=migs),
        sharing=Sharing(
            time_slicing=None
            if time_slicing is None
            else ReplicatedResources(time_slicing, fail_requests_greater_than_one=fail_gt1),
            mps=None if mps is None else ReplicatedResources(mps, fail_requests_greater_than_one=True),
        ),
    )
