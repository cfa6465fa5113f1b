"""The device-plugin API's messages: what the plan's records become on the wire, and how big they get.

Every message the plugin sends the kubelet is built here from plain records (PlannedDevice,
ContainerAllocation); nothing here holds state, opens a socket or logs.
"""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from nvdp.plan.model import PlannedDevice, PlannedResource
from nvdp.plugin.allocate import ContainerAllocation
from nvdp.plugin.api import deviceplugin_pb2 as pb
from nvdp.plugin.api import deviceplugin_pb2_grpc as _pb_grpc

# The generated service module has no type hints.
pb_grpc: Any = _pb_grpc

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# The kubelet reads ListAndWatch with gRPC's default receive limit; a longer list is refused on its
# side with RESOURCE_EXHAUSTED and the resource silently stays at its last list (or none).
KUBELET_MAX_RECEIVE_BYTES = 4 * 1024 * 1024


def plugin_options() -> Any:
    """What the plugin supports: GetPreferredAllocation, and no PreStartContainer."""
    return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def register_request(resource_name: str, endpoint: str) -> Any:
    """The kubelet's Register call for one resource served on `endpoint` (a socket name in its directory)."""
    return pb.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource_name, options=plugin_options()
    )


def device_message(device: PlannedDevice) -> Any:
    topology = None
    if device.numa_node is not None:
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa_node)])
    return pb.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY, topology=topology)


def list_and_watch_bytes(resource: PlannedResource) -> int:
    """The size of the resource's ListAndWatch message at its largest (every device Unhealthy)."""
    devices = [replace(d, healthy=False) for d in resource.devices]
    return int(pb.ListAndWatchResponse(devices=[device_message(d) for d in devices]).ByteSize())


def oversized(resource: PlannedResource, limit: int = KUBELET_MAX_RECEIVE_BYTES) -> str | None:
    """Why the kubelet would refuse the resource's device list, or None when it fits."""
    size = list_and_watch_bytes(resource)
    if size <= limit:
        return None
    return (
        f"{resource.name}: its {len(resource.devices)} devices make a {size / 2**20:.1f} MiB ListAndWatch "
        f"message, more than the {limit / 2**20:g} MiB the kubelet accepts; lower the replicas of this "
        "resource or share fewer devices with it"
    )


def allocation_message(allocation: ContainerAllocation) -> Any:
    return pb.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in allocation.devices
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[pb.CDIDevice(name=name) for name in allocation.cdi_devices],
    )
