"""The device IDs a container is given, from the IDs the kubelet allocated."""

from __future__ import annotations

from collections.abc import Iterable

from nvdp.config.model import DeviceIdStrategy
from nvdp.plan.model import PlannedDevice


def device_container_ids(devices: Iterable[PlannedDevice], strategy: DeviceIdStrategy) -> list[str]:
    """What the container sees for `devices`: UUIDs or indices, unique, in order.

    Replicas name their physical (or MIG) device, so two replicas of one GPU show it once.
    """
    return list(dict.fromkeys(d.index if strategy == "index" else d.base_id for d in devices))

