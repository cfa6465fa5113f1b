"""The device IDs a container is given, from the IDs the kubelet allocated."""

from __future__ import annotations

from collections.abc import Iterable

from nvdp.config.model import DeviceIdStrategy
from nvdp.plan.errors import UnknownDeviceError
from nvdp.plan.model import PlannedResource


def container_device_ids(
    resource: PlannedResource, ids: Iterable[str], strategy: DeviceIdStrategy
) -> list[str]:
    """UUIDs (replica suffix stripped) or indices ("0", "0:1"), unique, in the order requested.

    Several replicas of one GPU collapse to that GPU once. Raises UnknownDeviceError for an ID
    the resource does not advertise.
    """
    out: list[str] = []
    for device_id in ids:
        device = resource.device(device_id)
        if device is None:
            raise UnknownDeviceError(resource.name, device_id)
        value = device.index if strategy == "index" else device.base_id
        if value not in out:
            out.append(value)
    return out
