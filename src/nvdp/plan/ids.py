"""The device IDs a container is given, from the IDs the kubelet allocated.

The CDI spec names its devices with the same function, so every name Allocate emits resolves.
"""

from __future__ import annotations

from collections.abc import Iterable

from nvdp.config.model import DeviceIdStrategy
from nvdp.plan.model import PlannedDevice


def container_id(base_id: str, index: str, strategy: DeviceIdStrategy) -> str:
    """One device's ID for `deviceIDStrategy`: its UUID ("GPU-...", "MIG-...") or its index ("0", "0:1")."""
    return index if strategy == "index" else base_id


def device_container_ids(devices: Iterable[PlannedDevice], strategy: DeviceIdStrategy) -> list[str]:
    """What the container sees for `devices`: UUIDs or indices, unique, in order.

    Replicas name their physical (or MIG) device, so two replicas of one GPU show it once.
    """
    return list(dict.fromkeys(container_id(d.base_id, d.index, strategy) for d in devices))
