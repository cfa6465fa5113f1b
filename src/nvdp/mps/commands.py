"""What each MPS control daemon is told: thread share and pinned-memory limit per GPU.

These are the server's ceilings: every client of the daemon's MPS server is held to them, and a client's
own `CUDA_MPS_*` variables can only lower them (measured on an H100). They are defaults, applied by the
daemon to each server it starts afterwards, so they are sent before the daemon is marked ready and any
client can connect. In device-plugin mode they are the node config's replica share (100/N % of the
threads, memory/N pinned); in DRA mode, the largest limits among the claims on the daemon's GPUs
(`Ceiling`). Pure functions of the plan and the inventory, so the arithmetic is tested without processes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from msgspec import Struct

from nvdp.inventory.model import Inventory
from nvdp.plan.model import PlannedResource
from nvdp.plan.sharing import mps_replica_cap

MIB = 1024 * 1024
# Per-client pinned-memory limits exist only from Volta on; older servers reject the command.
MIN_CC_FOR_MEMORY_LIMIT = (7, 0)


class MpsConfigError(ValueError):
    """A shared resource that MPS cannot serve as configured; the message names the fix."""


def max_replicas_per_gpu(compute_capability: tuple[int, int]) -> int:
    """Most MPS clients per GPU; the plan refuses larger configs already, the daemon checks again."""
    return mps_replica_cap(compute_capability)


class MpsGpu(Struct, frozen=True):
    uuid: str
    index: int  # NVML index on the node
    ordinal: int  # position in the daemon's CUDA_VISIBLE_DEVICES, what MPS commands address
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    replicas: int

    @property
    def pinned_memory_limit_mib(self) -> int | None:
        """Each client's share of the GPU's memory, or None when no limit can be set."""
        if self.memory_bytes <= 0 or self.compute_capability < MIN_CC_FOR_MEMORY_LIMIT:
            return None
        return self.memory_bytes // self.replicas // MIB


class Ceiling(Struct, frozen=True):
    """A DRA daemon's limits, set by the claims that use it rather than by replicas."""

    thread_percentage: int  # 1..100
    memory_mib: tuple[int | None, ...]  # per GPU, in the daemon's order; None: no limit


class MpsSettings(Struct, frozen=True):
    resource_name: str
    gpus: tuple[MpsGpu, ...]  # in CUDA_VISIBLE_DEVICES order
    ceiling: Ceiling | None = None  # DRA: the claims' ceiling, in place of the replica share

    @property
    def replicas(self) -> int:
        return max(g.replicas for g in self.gpus)

    @property
    def active_thread_percentage(self) -> int:
        if self.ceiling is not None:
            return self.ceiling.thread_percentage
        return 100 // self.replicas

    def memory_limit_mib(self, gpu: MpsGpu) -> int | None:
        """The pinned-memory ceiling of one of the daemon's GPUs; None: none (or none can be set)."""
        if self.ceiling is None:
            return gpu.pinned_memory_limit_mib
        if gpu.compute_capability < MIN_CC_FOR_MEMORY_LIMIT:
            return None
        return self.ceiling.memory_mib[gpu.ordinal]

    @property
    def visible_devices(self) -> str:
        # UUIDs, not indices: MPS renumbers the devices it sees, UUIDs stay unambiguous.
        return ",".join(g.uuid for g in self.gpus)

    @property
    def commands(self) -> tuple[str, ...]:
        """The defaults for the servers the daemon starts: sent before any client can connect."""
        lines = [f"set_default_active_thread_percentage {self.active_thread_percentage}"]
        for gpu in self.gpus:
            limit = self.memory_limit_mib(gpu)
            if limit is not None:
                lines.append(f"set_default_device_pinned_mem_limit {gpu.ordinal} {limit}M")
        return tuple(lines)

    def retune_commands(self, servers: Sequence[str]) -> tuple[str, ...]:
        """A running daemon's new ceiling: its defaults for servers started later, and the same limits
        for each server already running (`servers`: their PIDs), which its next clients get. A GPU
        without a limit gets its whole memory, since a limit once set cannot be unset."""
        memory = []
        for gpu in self.gpus:
            if gpu.compute_capability < MIN_CC_FOR_MEMORY_LIMIT or gpu.memory_bytes <= 0:
                continue
            limit = self.memory_limit_mib(gpu)
            memory.append((gpu.ordinal, limit if limit is not None else gpu.memory_bytes // MIB))
        lines = [f"set_default_active_thread_percentage {self.active_thread_percentage}"]
        lines += [f"set_default_device_pinned_mem_limit {ordinal} {mib}M" for ordinal, mib in memory]
        for pid in servers:
            lines.append(f"set_active_thread_percentage {pid} {self.active_thread_percentage}")
            lines += [f"set_device_pinned_mem_limit {pid} {ordinal} {mib}M" for ordinal, mib in memory]
        return tuple(lines)

    def describe(self) -> str:
        parts = []
        for gpu in self.gpus:
            limit = self.memory_limit_mib(gpu)
            each = "" if self.ceiling is not None else " each"
            memory = f"{limit}M pinned memory{each}" if limit is not None else "no memory limit"
            share = "claims' ceiling" if self.ceiling is not None else f"{gpu.replicas} replicas"
            parts.append(f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}): {share}, {memory}")
        return (
            f"{self.resource_name}: active thread percentage {self.active_thread_percentage}; "
            + "; ".join(parts)
        )


def mps_settings(resource: PlannedResource, inventory: Inventory) -> MpsSettings:
    """The daemon settings for one MPS-shared resource; MpsConfigError if MPS cannot serve it."""
    mig = [d.id for d in resource.devices if d.is_mig]
    if mig:
        raise MpsConfigError(
            f"sharing using MPS is not supported for MIG devices: resource {resource.name} holds "
            f"{', '.join(sorted(set(mig)))}; share MIG devices with sharing.timeSlicing, or set "
            "flags.migStrategy=none to share whole GPUs with MPS"
        )
    if not resource.devices:
        raise MpsConfigError(f"resource {resource.name} has no devices to share with MPS")
    counts = Counter(uuid for d in resource.devices for uuid in d.gpu_uuids)
    gpus = []
    for uuid in counts:
        gpu = inventory.gpu(uuid)
        if gpu is None:
            raise MpsConfigError(
                f"resource {resource.name} refers to GPU {uuid}, which this node's inventory lacks"
            )
        gpus.append(gpu)
    gpus.sort(key=lambda g: g.index)
    result = []
    for ordinal, gpu in enumerate(gpus):
        replicas = counts[gpu.uuid]
        cap = max_replicas_per_gpu(gpu.compute_capability)
        if replicas > cap:
            major, minor = gpu.compute_capability
            raise MpsConfigError(
                f"invalid MPS configuration: resource {resource.name} asks for {replicas} replicas of "
                f"GPU {gpu.index} ({gpu.name}, compute capability {major}.{minor}), more than the "
                f"{cap} MPS clients it supports; set sharing.mps.resources[].replicas to {cap} or less"
            )
        result.append(
            MpsGpu(
                uuid=gpu.uuid,
                index=gpu.index,
                ordinal=ordinal,
                name=gpu.name,
                memory_bytes=gpu.memory_bytes,
                compute_capability=gpu.compute_capability,
                replicas=replicas,
            )
        )
    return MpsSettings(resource_name=resource.name, gpus=tuple(result))
