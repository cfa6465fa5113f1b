"""Small inventories and configs for MPS tests."""

from __future__ import annotations

from nvdp.config.model import Config, Flags, ReplicatedResource, ReplicatedResources, Sharing
from nvdp.inventory.model import Gpu, Inventory

MIB = 1024 * 1024


def gpu(
    index: int,
    name: str = "Tesla T4",
    memory_mib: int = 15360,
    cc: tuple[int, int] = (7, 5),
    uuid: str | None = None,
) -> Gpu:
    return Gpu(
        index=index,
        uuid=uuid or f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name=name,
        memory_bytes=memory_mib * MIB,
        compute_capability=cc,
        minor=index,
        pci_bus_id=f"00000000:{index + 1:02x}:00.0",
    )


def inventory(*gpus: Gpu) -> Inventory:
    return Inventory(driver_version="550.54.15", cuda_driver_version="12.4", gpus=tuple(gpus))


def mps_config(replicas: int = 10, name: str = "nvidia.com/gpu", mps_root: str = "/run/nvidia/mps") -> Config:
    """The seed's config: sharing.mps.resources[{name: nvidia.com/gpu, replicas: 10}]."""
    return Config(
        flags=Flags(mps_root=mps_root),
        sharing=Sharing(
            mps=ReplicatedResources(
                resources=(ReplicatedResource(name=name, replicas=replicas),),
                fail_requests_greater_than_one=True,
            )
        ),
        source="test",
    )
