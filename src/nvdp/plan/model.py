"""The resource plan: which Kubernetes resources a node advertises, and the devices behind each."""

from __future__ import annotations

from functools import cached_property

from msgspec import Struct
from msgspec.structs import replace

from nvdp.config.model import SharingStrategy

REPLICA_SEPARATOR = "::"


class PlannedDevice(Struct, frozen=True):
    id: str  # advertised to the kubelet: "GPU-...", "MIG-...", "GPU-...::3"
    base_id: str  # the physical or MIG device's UUID (id without the replica suffix)
    index: str  # "0" for a GPU, "0:1" for a MIG device (what deviceIDStrategy=index hands out)
    gpu_uuids: tuple[str, ...]  # physical GPU(s) behind it
    gpu_indices: tuple[int, ...]
    minors: tuple[int, ...]  # /dev/nvidia<minor> of those GPUs
    numa_node: int | None
    memory_bytes: int
    replica: int | None = None  # None: not shared
    mig: tuple[int, int] | None = None  # (gi_id, ci_id) for MIG devices
    healthy: bool = True

    @property
    def is_mig(self) -> bool:
        return self.mig is not None


class PlannedResource(Struct, frozen=True, dict=True):
    name: str  # fully qualified, "nvidia.com/gpu"
    devices: tuple[PlannedDevice, ...]
    sharing: SharingStrategy = "none"
    replicas: int = 1
    fail_requests_greater_than_one: bool = False
    # sharing.mps with strictShares: in DRA mode every claim gets exactly one replica's share.
    strict_shares: bool = False
    # The resource name before `rename` / `renameByDefault`, for messages.
    source_name: str = ""

    @property
    def short_name(self) -> str:
        """The part after "nvidia.com/", used in socket names: nvidia-<short_name>.sock."""
        return self.name.split("/", 1)[-1]

    # (dict=True above gives this cache somewhere to live; it takes no part in == or hash.)
    @cached_property
    def _devices_by_id(self) -> dict[str, PlannedDevice]:
        # Allocate looks IDs up on every call; a resource can hold thousands of replicas.
        return {d.id: d for d in self.devices}

    def device(self, device_id: str) -> PlannedDevice | None:
        return self._devices_by_id.get(device_id)


class Exclusion(Struct, frozen=True):
    """A physical device that no resource advertises, and why."""

    device: str  # UUID, or "GPU <index>" when the UUID is unknown
    reason: str


class Plan(Struct, frozen=True):
    resources: tuple[PlannedResource, ...] = ()
    excluded: tuple[Exclusion, ...] = ()
    warnings: tuple[str, ...] = ()

    def resource(self, name: str) -> PlannedResource | None:
        return next((r for r in self.resources if r.name == name), None)

    def with_health(self, unhealthy: frozenset[str]) -> Plan:
        """The plan with exactly the devices backed by one of `unhealthy` (GPU or MIG UUIDs) Unhealthy.

        A GPU's UUID covers all its replicas and MIG devices; a MIG UUID covers that MIG device.
        """
        # One pass, and new objects only for what changes: this runs on the health path, between the
        # XID and the kubelet. Unchanged resources (and the plan, when nothing changes) stay the same
        # objects: the health path compares them with the running ones right after, by identity.
        resources = list(self.resources)
        changed = False
        for n, resource in enumerate(resources):
            flip = [i for i, d in enumerate(resource.devices)
                    if d.healthy == (d.base_id in unhealthy or not unhealthy.isdisjoint(d.gpu_uuids))]
            if flip:
                devices = list(resource.devices)
                for i in flip:
                    devices[i] = replace(devices[i], healthy=not devices[i].healthy)
                resources[n] = replace(resource, devices=tuple(devices))
                changed = True
        return replace(self, resources=tuple(resources)) if changed else self
