"""A prepared claim's devices, told both ways: its `status.devices` entries and its requests' metadata
files, from its checkpoint entry and what the node publishes now (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from nvdp.dra.claims.identity.device import claim_identities, metadata_attributes, status_entry
from nvdp.dra.claims.identity.metadata import ClaimFile, MetadataDevice, claim_files
from nvdp.dra.claims.records import ClaimEntry
from nvdp.dra.pool.devices import DraDevice


class NodeView(Protocol):
    """What the node publishes now and which devices are down (nvdp.dra.claims.check.NodeView)."""

    @property
    def devices(self) -> Mapping[str, DraDevice]: ...

    def unhealthy_device(self, name: str) -> bool: ...


def status_entries(driver: str, entry: ClaimEntry, devices: Mapping[str, DraDevice]) -> list[dict[str, Any]]:
    """This driver's `status.devices` entries of a prepared claim, one per device and share."""
    made = {s.device: s.mig for s in entry.made if s.mig is not None}
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for prepared, identity in claim_identities(entry.devices, devices, entry.share, made):
        found.setdefault((prepared.device, prepared.share_id), status_entry(driver, identity))
    return list(found.values())


def request_files(driver: str, entry: ClaimEntry, view: NodeView) -> tuple[ClaimFile, ...]:
    """The device metadata file of each request of a claim (`entry.devices`: its prepared devices),
    its devices' health as `view` has it."""
    made = {s.device: s.mig for s in entry.made if s.mig is not None}
    requests: dict[str, tuple[str, list[MetadataDevice]]] = {}
    for prepared, identity in claim_identities(entry.devices, view.devices, entry.share, made):
        attributes = metadata_attributes(identity, view.devices[prepared.device].attributes,
                                         healthy=not view.unhealthy_device(prepared.device))
        _, devices = requests.setdefault(prepared.request_names[0], (prepared.request_ref, []))
        devices.append(MetadataDevice(pool=prepared.pool, name=prepared.device, attributes=attributes))
    return claim_files(driver, namespace=entry.namespace, name=entry.name, uid=entry.uid,
                       pod_claim=entry.pod_claim_name, generation=max(1, entry.metadata_generation),
                       requests=requests)


def health_changed(entry: ClaimEntry, view: NodeView, changed: frozenset[str]) -> bool:
    """Whether the health of one of the claim's devices is among the `changed` UUIDs (its GPU's, or
    its own)."""
    ours = [view.devices[d.device] for d in entry.devices if d.device in view.devices]
    return any({d.uuid, d.gpu_uuid} & changed for d in ours)
