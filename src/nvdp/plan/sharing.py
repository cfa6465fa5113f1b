"""Replicas for time-slicing and MPS: which devices of which resource are shared, and under what name."""

from __future__ import annotations

from msgspec import Struct
from msgspec.structs import replace

from nvdp.config.model import DeviceSelection, ReplicatedResource, ReplicatedResources, Sharing
from nvdp.inventory.model import Inventory
from nvdp.plan.errors import PlanError
from nvdp.plan.model import REPLICA_SEPARATOR, PlannedDevice, PlannedResource

# Most MPS clients per GPU, as NVIDIA's MPS daemon checks it: 48 from compute capability 7.5,
# 16 below (pre-Volta MPS limit).
MPS_MAX_CLIENTS = 48
MPS_MAX_CLIENTS_BEFORE_7_5 = 16


def mps_replica_cap(compute_capability: tuple[int, int]) -> int:
    return MPS_MAX_CLIENTS if compute_capability >= (7, 5) else MPS_MAX_CLIENTS_BEFORE_7_5


class _SharedGroup(Struct, frozen=True):
    label: str  # "sharing.timeSlicing.resources[0]", for messages
    entry: ReplicatedResource
    target: str  # the advertised name: rename, or the entry's name
    devices: tuple[PlannedDevice, ...]  # physical devices, before replication


def device_sort_key(device: PlannedDevice) -> tuple[int, int, int]:
    """GPU index, then MIG index (a whole GPU first), then replica."""
    gpu, _, mig = device.index.partition(":")
    return (int(gpu), int(mig) if mig else -1, -1 if device.replica is None else device.replica)


def _ref_matches(ref: str, device: PlannedDevice) -> bool:
    if ref.isdigit():
        return not device.is_mig and device.index == str(int(ref))
    if ":" in ref and not ref.startswith(("GPU-", "MIG-")):
        return device.is_mig and device.index == ref
    if ref.startswith("MIG-GPU-") and "/" in ref:
        # The pre-R470 MIG UUID form: MIG-<parent GPU UUID>/<gi>/<ci>.
        parent, _, rest = ref[len("MIG-") :].partition("/")
        gi, _, ci = rest.partition("/")
        return (
            device.mig is not None
            and device.gpu_uuids == (parent,)
            and (str(device.mig[0]), str(device.mig[1])) == (gi, ci)
        )
    return device.base_id == ref


def _select(
    selection: DeviceSelection, devices: list[PlannedDevice], label: str, name: str, warnings: list[str]
) -> list[PlannedDevice]:
    if selection.all:
        return list(devices)
    if selection.count is not None:
        if selection.count > len(devices):
            warnings.append(
                f"{label}: devices: {selection.count} asks for more devices than {name} has on this "
                f"node ({len(devices)}); sharing all {len(devices)}"
            )
        return devices[: selection.count]
    for ref in selection.refs:
        if not any(_ref_matches(ref, d) for d in devices):
            warnings.append(
                f"{label}: device '{ref}' is not one of the {len(devices)} device(s) of {name} on "
                f"this node ({', '.join(d.index for d in devices)}); it is not shared"
            )
    return [d for d in devices if any(_ref_matches(r, d) for r in selection.refs)]


def chosen_replicated_resources(sharing: Sharing) -> tuple[str, ReplicatedResources | None]:
    """The sharing block in effect and its config key. MPS wins when both are set (as NVIDIA does)."""
    strategy = sharing.strategy
    if strategy == "mps" or (strategy == "none" and sharing.mps is not None):
        return "mps", sharing.mps
    return "timeSlicing", sharing.time_slicing


def apply_sharing(
    sharing: Sharing,
    base: dict[str, list[PlannedDevice]],
    inventory: Inventory,
    warnings: list[str],
) -> list[PlannedResource]:
    """Turn unshared resources into the advertised ones: replicated, renamed, or left as they are."""
    key, replicated = chosen_replicated_resources(sharing)
    if sharing.strategy == "mps" and sharing.time_slicing is not None and sharing.time_slicing.resources:
        warnings.append(
            "sharing.timeSlicing is ignored because sharing.mps is set; a node uses one sharing "
            "strategy: remove one of the two blocks"
        )
    if replicated is None:
        return _assemble(base, [], sharing, False)
    groups = _shared_groups(key, replicated, base, inventory, warnings)
    return _assemble(base, groups, sharing, replicated.fail_requests_greater_than_one)


def _shared_groups(
    key: str,
    replicated: ReplicatedResources,
    base: dict[str, list[PlannedDevice]],
    inventory: Inventory,
    warnings: list[str],
) -> list[_SharedGroup]:
    """The devices each sharing entry takes, checked: one entry per device, MPS limits."""
    groups: list[_SharedGroup] = []
    claimed: dict[str, str] = {}  # device base_id -> label of the entry that shares it
    for i, entry in enumerate(replicated.resources):
        label = f"sharing.{key}.resources[{i}]"
        devices = base.get(entry.name)
        if not devices:
            existing = ", ".join(sorted(base)) or "none"
            warnings.append(
                f"{label}: no resource named {entry.name} on this node (resources: {existing}); "
                "the entry has no effect"
            )
            continue
        if entry.replicas <= 1:
            continue  # `replicas: 1` switches sharing off for this resource
        selected = _select(entry.devices, devices, label, entry.name, warnings)
        if not selected:
            continue  # an empty list, or every ref missed (_select said which)
        for device in selected:
            if device.base_id in claimed:
                raise PlanError(
                    f"{label}: device {device.index} ({device.base_id}) of {entry.name} is already "
                    f"shared by {claimed[device.base_id]}; a device can be in one sharing entry only: "
                    "give the entries disjoint `devices` lists"
                )
            claimed[device.base_id] = label
        if key == "mps":
            _check_mps(label, entry, selected, inventory)
        groups.append(_SharedGroup(label, entry, entry.rename or entry.name, tuple(selected)))
    return groups


def _assemble(
    base: dict[str, list[PlannedDevice]], groups: list[_SharedGroup], sharing: Sharing, fail_gt1: bool
) -> list[PlannedResource]:
    """Unshared leftovers plus one replicated resource per group, refusing two owners of a name."""
    shared = {d.base_id for g in groups for d in g.devices}
    out: dict[str, PlannedResource] = {}
    owners: dict[str, str] = {}
    for name, devices in base.items():
        rest = tuple(d for d in devices if d.base_id not in shared)
        if rest:
            out[name] = PlannedResource(name=name, devices=rest, source_name=name)
            owners[name] = f"the unshared devices of {name}"
    for group in groups:
        if group.target in out:
            raise PlanError(_collision(group, owners[group.target], base))
        replicas = tuple(
            replace(d, id=f"{d.base_id}{REPLICA_SEPARATOR}{n}", replica=n)
            for d in group.devices
            for n in range(group.entry.replicas)
        )
        out[group.target] = PlannedResource(
            name=group.target,
            devices=tuple(sorted(replicas, key=device_sort_key)),
            sharing=sharing.strategy,
            replicas=group.entry.replicas,
            fail_requests_greater_than_one=fail_gt1,
            strict_shares=group.entry.strict_shares and sharing.strategy == "mps",
            source_name=group.entry.name,
        )
        owners[group.target] = group.label
    return [out[name] for name in sorted(out)]


def _collision(group: _SharedGroup, owner: str, base: dict[str, list[PlannedDevice]]) -> str:
    name = group.entry.name
    if group.target == name and owner.startswith("the unshared"):
        return (
            f"{group.label} shares {len(group.devices)} of the {len(base[name])} devices of {name} without "
            f"a rename, so {name} would hold shared and unshared devices at once; set `rename` (for "
            f"example {name}.shared) or share all its devices"
        )
    return (
        f"{group.label} would advertise {group.target}, which {owner} already advertises; "
        "give each shared resource its own `rename`"
    )


def _check_mps(label: str, entry: ReplicatedResource, devices: list[PlannedDevice], inv: Inventory) -> None:
    for device in devices:
        if device.is_mig:
            raise PlanError(
                f"{label} ({entry.name}): sharing using MPS is not supported for MIG devices "
                f"(MIG device {device.index}, {device.base_id}); share MIG devices with "
                "sharing.timeSlicing instead, or leave this resource out of sharing.mps"
            )
        gpu = inv.gpu(device.base_id)
        if gpu is None:
            continue
        if gpu.mig_enabled:
            # Under migStrategy none the whole GPU is advertised, but no MPS daemon can serve it.
            raise PlanError(
                f"{label} ({entry.name}): sharing using MPS is not supported for MIG devices (GPU "
                f"{gpu.index}, {gpu.uuid}, has MIG mode enabled); disable MIG mode on it "
                f"(`nvidia-smi -i {gpu.index} -mig 0`), or share it with sharing.timeSlicing instead"
            )
        cap = mps_replica_cap(gpu.compute_capability)
        if entry.replicas > cap:
            major, minor = gpu.compute_capability
            raise PlanError(
                f"{label} ({entry.name}): {entry.replicas} MPS replicas on GPU {gpu.index} ({gpu.name}, "
                f"{gpu.uuid}) exceed the maximum of {cap} MPS clients for a GPU of compute capability "
                f"{major}.{minor}; set replicas to {cap} or less"
            )
