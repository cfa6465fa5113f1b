"""Hand-built inventories, planned resources and configs for the gRPC layer's tests."""

from __future__ import annotations

from nvdp.config.model import Config, Flags, PluginFlags
from nvdp.inventory.model import Gpu, Inventory, Link, MigDevice
from nvdp.plan.model import PlannedDevice, PlannedResource


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def make_gpus(count: int, numa_split: int | None = None) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=i,
            uuid=gpu_uuid(i),
            name="NVIDIA A100-SXM4-40GB",
            memory_bytes=40 << 30,
            compute_capability=(8, 0),
            minor=i,
            pci_bus_id=f"00000000:{i + 1:02x}:00.0",
            numa_node=None if numa_split is None else (0 if i < numa_split else 1),
        )
        for i in range(count)
    )


def make_inventory(count: int, links: tuple[Link, ...] = (), numa_split: int | None = None) -> Inventory:
    return Inventory(
        driver_version="550.54.15", cuda_driver_version="12.4", gpus=make_gpus(count, numa_split), links=links
    )


def whole_gpu_resource(inventory: Inventory, name: str = "nvidia.com/gpu") -> PlannedResource:
    return PlannedResource(
        name=name,
        devices=tuple(
            PlannedDevice(
                id=g.uuid,
                base_id=g.uuid,
                index=str(g.index),
                gpu_uuids=(g.uuid,),
                gpu_indices=(g.index,),
                minors=(g.minor,),
                numa_node=g.numa_node,
                memory_bytes=g.memory_bytes,
            )
            for g in inventory.gpus
        ),
    )


def replicated_resource(
    inventory: Inventory,
    replicas: int,
    *,
    sharing: str = "time-slicing",
    fail_requests_greater_than_one: bool = False,
    name: str = "nvidia.com/gpu",
) -> PlannedResource:
    return PlannedResource(
        name=name,
        devices=tuple(
            PlannedDevice(
                id=f"{g.uuid}::{r}",
                base_id=g.uuid,
                index=str(g.index),
                gpu_uuids=(g.uuid,),
                gpu_indices=(g.index,),
                minors=(g.minor,),
                numa_node=g.numa_node,
                memory_bytes=g.memory_bytes,
                replica=r,
            )
            for g in inventory.gpus
            for r in range(replicas)
        ),
        sharing=sharing,  # type: ignore[arg-type]
        replicas=replicas,
        fail_requests_greater_than_one=fail_requests_greater_than_one,
        source_name=name,
    )


def mig_resource(
    gpu: Gpu, migs: tuple[MigDevice, ...], name: str = "nvidia.com/mig-1g.5gb"
) -> PlannedResource:
    return PlannedResource(
        name=name,
        devices=tuple(
            PlannedDevice(
                id=m.uuid,
                base_id=m.uuid,
                index=m.index_id,
                gpu_uuids=(gpu.uuid,),
                gpu_indices=(gpu.index,),
                minors=(gpu.minor,),
                numa_node=gpu.numa_node,
                memory_bytes=m.memory_bytes,
                mig=(m.gi_id, m.ci_id),
            )
            for m in migs
        ),
    )


def config_with(**plugin: object) -> Config:
    flag_fields = {k: plugin.pop(k) for k in list(plugin) if k in Flags.__struct_fields__}
    return Config(flags=Flags(plugin=PluginFlags(**plugin), **flag_fields))  # type: ignore[arg-type]
