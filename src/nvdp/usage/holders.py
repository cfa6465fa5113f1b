"""Which container holds which device, and its pod's UID: the kubelet's pod-resources answer joined with
the kubelet's device checkpoint (device plugin) or the claims' `status.reservedFor` (DRA). Plain data.

The pod-resources API names pods by namespace and name, cgroups by UID; these join them:

- Device plugin: the kubelet keeps every container's devices, by pod UID and container name, in its
  device-manager checkpoint (`kubelet_internal_checkpoint`, beside its registration socket). A device
  ID (a GPU UUID, or a replica `GPU-...::3` when GPUs are shared) is given to one container at a
  time, so the checkpoint's entry holding a container's device ID names its pod's UID.
- DRA: a claim's `status.reservedFor` lists the pods using it, with their UIDs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nvdp.plan.model import REPLICA_SEPARATOR
from nvdp.usage.model import Holder

if TYPE_CHECKING:
    from nvdp.daemon.podresources.client import ContainerHold

CHECKPOINT_FILE = "kubelet_internal_checkpoint"

# (resource name, device ID) -> (pod UID, container name)
DeviceOwners = Mapping[tuple[str, str], tuple[str, str]]
# (claim namespace, claim name) -> {pod name: pod UID}
ClaimPods = Mapping[tuple[str, str], Mapping[str, str]]


class CheckpointError(ValueError):
    """The kubelet's device checkpoint is not what this reader knows; the message says what and where."""


def checkpoint_owners(text: str, where: str = CHECKPOINT_FILE) -> dict[tuple[str, str], tuple[str, str]]:
    """The device owners of the kubelet's device-manager checkpoint (`{"Data": {"PodDeviceEntries":
    [{"PodUID", "ContainerName", "ResourceName", "DeviceIDs": {"<NUMA node>": [...]}}, ...]}}`; before
    Kubernetes 1.20 `DeviceIDs` was a plain list)."""
    try:
        doc = json.loads(text)
        entries = doc["Data"].get("PodDeviceEntries") or []
        owners: dict[tuple[str, str], tuple[str, str]] = {}
        for entry in entries:
            ids = entry.get("DeviceIDs") or {}
            flat = [i for group in ids.values() for i in group or ()] if isinstance(ids, dict) else list(ids)
            for device_id in flat:
                owners[(str(entry["ResourceName"]), str(device_id))] = (
                    str(entry["PodUID"]), str(entry.get("ContainerName", "")))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"{where} is not a kubelet device checkpoint this version reads ({type(err).__name__}: {err}); "
            "the device plugin's usage series stay empty until it is") from None
    return owners


def plugin_holders(holds: Iterable[ContainerHold], devices: set[str], owners: DeviceOwners) -> list[Holder]:
    """The holders of device-plugin devices whose IDs name one of `devices` (GPU and MIG UUIDs), once
    per container and device; pod UIDs from `owners`."""
    found: dict[tuple[str, str, str, str], Holder] = {}
    for hold in holds:
        for resource, ids in hold.devices:
            for device_id in ids:
                uuid = device_id.split(REPLICA_SEPARATOR, 1)[0]
                if uuid not in devices:
                    continue
                key = (uuid, hold.namespace, hold.pod, hold.container)
                uid = owners.get((resource, device_id), ("", ""))[0]
                if key not in found or (uid and not found[key].pod_uid):
                    found[key] = Holder(device=uuid, namespace=hold.namespace, pod=hold.pod,
                                        container=hold.container, pod_uid=uid, resource=resource)
    return list(found.values())


def claim_holders(holds: Iterable[ContainerHold], driver: str, names: Mapping[str, str],
                  pods: ClaimPods) -> tuple[list[Holder], set[str]]:
    """The holders of `driver`'s devices through claims, once per container, claim and device; pod
    UIDs from `pods`. Also the device names `names` (DRA name -> UUID) does not know."""
    found: dict[tuple[str, ...], Holder] = {}
    unknown: set[str] = set()
    for hold in holds:
        for claim in hold.claims:
            uid = pods.get((claim.namespace, claim.name), {}).get(hold.pod, "")
            for claim_driver, pool, device in claim.devices:
                if claim_driver != driver:
                    continue
                uuid = names.get(device)
                if uuid is None:
                    unknown.add(device)
                    continue
                key = (uuid, hold.namespace, hold.pod, hold.container, claim.namespace, claim.name)
                found.setdefault(key, Holder(
                    device=uuid, namespace=hold.namespace, pod=hold.pod, container=hold.container,
                    pod_uid=uid, claim_namespace=claim.namespace, claim_name=claim.name, driver=driver,
                    pool=pool, device_name=device))
    return list(found.values()), unknown


def claims_of(holds: Iterable[ContainerHold], driver: str) -> list[tuple[str, str]]:
    """The claims held on the node that have a device of `driver`, each once."""
    return list(dict.fromkeys((claim.namespace, claim.name) for hold in holds for claim in hold.claims
                              if any(d[0] == driver for d in claim.devices)))


def reserved_pods(claim: Mapping[str, Any]) -> dict[str, str]:
    """{pod name: pod UID} of the pods a claim (the API's JSON) is reserved for."""
    reserved: Sequence[Mapping[str, Any]] = (claim.get("status") or {}).get("reservedFor") or ()
    return {str(r.get("name", "")): str(r.get("uid", "")) for r in reserved
            if r.get("resource") == "pods" and not r.get("apiGroup")}
