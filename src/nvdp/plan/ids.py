"""The device IDs a container is given, from the IDs the kubelet allocated."""

from __future__ import annotations

from collections.abc import Iterable

from nvdp.config.model import DeviceIdStrategy
from nvdp.plan.errors import UnknownDeviceError
from nvdp.plan.model import PlannedDevice, PlannedResource


def device_container_ids(devices: Iterable[PlannedDevice], strategy: DeviceIdStrategy) -> list[str]:
    """What the container sees for `devices`: UUIDs or indices, unique, in order.

    Replicas name their physical (or MIG) device, so two replicas of one GPU show it once.
    """
    return list(dict.fromkeys(d.index if strategy == "index" else d.base_id for d in devices))


def container_device_ids(
    resource: PlannedResource, ids: Iterable[str], strategy: DeviceIdStrategy
) -> list[str]:
    """UUIDs (replica suffix stripped) or indices ("0", "0:1"), unique, in the order requested.

    Several replicas of one GPU collapse to that GPU once. Raises UnknownDeviceError for an ID
    the resource does not advertise.
    """
    devices: list[PlannedDevice] = []
    for device_id in ids:
        device = resource.device(device_id)
        if device is None:
            raise UnknownDeviceError(resource.name, device_id)
        devices.append(device)
    return device_container_ids(devices, strategy)
