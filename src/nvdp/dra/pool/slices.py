"""The ResourceSlices (resource.k8s.io/v1) a node's DRA devices are published in.

One pool per node, named after the node, in slices of at most 128 devices. Plain data in, plain API
objects out: writing them is the publisher's job.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from nvdp.dra.pool.devices import CounterSet, DraDevice

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
# A slice whose devices carry taints holds at most 64 (resource.k8s.io/v1
# ResourceSliceMaxDevicesWithTaintsOrConsumesCounters); with taints on, every slice is cut at 64, so a
# taint coming or going never moves devices between slices.
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
# Devices that consume counters (partitionable devices, KEP-4815) hold at most 64 per slice too, and
# the counter sets go in slices of their own, at most 8 per slice (ResourceSliceMaxCounterSets).
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_NAME = 253  # a DNS subdomain
# The capacity a shared device counts its claims in (`device.capacity['<driver>'].replicas` in CEL).
REPLICAS_CAPACITY = "replicas"
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}  # fmt: skip


def slice_name(node: str, driver: str, index: int) -> str:
    """f"{node}-{driver}-{index}"; a name past 253 characters is cut and made unique by a hash of it."""
    base, suffix = f"{node}-{driver}", f"-{index}"
    if len(base) + len(suffix) <= MAX_NAME:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    cut = base[: MAX_NAME - len(suffix) - len(digest) - 1].rstrip("-.")
    return f"{cut}-{digest}{suffix}"


def desired_slices(
    *,
    node: str,
    node_uid: str,
    driver: str,
    devices: Sequence[DraDevice],
    unhealthy: frozenset[str] = frozenset(),
    generation: int = 1,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Full ResourceSlice objects for the node's pool; no device at all still gives one slice (the pool
    exists, empty). The counter sets devices consume (migStrategy dynamic) come first, in slices of
    their own, whether or not the devices consuming them are shown.

    `taints` None (an API server without device taints): devices whose own or whose GPU's UUID is in
    `unhealthy` are left out. Otherwise every device is published, with its taints from `taints` (by
    device name; `nvdp.dra.pool.taints.slice_taints`), and `unhealthy` is not used."""
    if taints is None:
        shown = [d for d in devices if d.uuid not in unhealthy and d.gpu_uuid not in unhealthy]
        size = MAX_DEVICES_PER_SLICE
    else:
        shown, size = list(devices), MAX_DEVICES_PER_SLICE_WITH_TAINTS
    counter_sets = list({d.counter_set.name: d.counter_set for d in devices if d.counter_set}.values())
    if counter_sets:
        size = MAX_DEVICES_PER_SLICE_WITH_TAINTS
    chunks = [shown[i : i + size] for i in range(0, len(shown), size)] or [[]]
    sets = [list(counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE])
            for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)]
    count = len(sets) + len(chunks)
    marks = taints or {}
    out = [_slice(node, node_uid, driver, i, count, generation, [], marks, chunk)
           for i, chunk in enumerate(sets)]
    out += [_slice(node, node_uid, driver, len(sets) + i, count, generation, chunk, marks)
            for i, chunk in enumerate(chunks)]
    return out


def slice_taints_of(obj: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The taints each device of a slice carries, by device name (devices without any left out): to see
    whether the API server kept what was written."""
    devices = (obj.get("spec") or {}).get("devices") or []
    return {str(d.get("name")): list(d.get("taints")) for d in devices if d.get("taints")}


def _slice(
    node: str, node_uid: str, driver: str, index: int, count: int, generation: int, devices: list[DraDevice],
    taints: Mapping[str, Sequence[Mapping[str, Any]]], counter_sets: Sequence[CounterSet] = (),
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": slice_name(node, driver, index)}
    if node_uid:
        # owned by the Node: the slices go away with it
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **({"sharedCounters": [_counter_set(c) for c in counter_sets]} if counter_sets
               else {"devices": [_device(d, taints.get(d.name, ())) for d in devices]}),
        },
    }


def _counter_set(counter_set: CounterSet) -> dict[str, Any]:
    return {"name": counter_set.name,
            "counters": {k: {"value": str(v)} for k, v in counter_set.counters.items()}}


def _device(device: DraDevice, taints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    attributes = {k: dict(v) for k, v in device.attributes.items()}
    out: dict[str, Any] = {"name": device.name, "attributes": attributes}
    capacity: dict[str, Any] = {k: dict(v) for k, v in device.capacity.items()}
    if device.shared:
        # Consumable capacity (KEP-5075; beta and on in Kubernetes 1.36): up to `replicas` claims are
        # allocated this one device, each taking one replica and its share of every other capacity
        # unless it asks for more. A capacity without a request policy would be taken whole by the
        # first claim, so each gets a default. API servers without the DRAConsumableCapacity gate
        # drop these fields, and the device is then allocated to one claim at a time.
        # Strict shares offer the default as the only valid value: the scheduler rounds a smaller
        # request up to it and allocates no claim asking for more.
        out["allowMultipleAllocations"] = True
        share = share_capacity(device)
        capacity[REPLICAS_CAPACITY] = {"value": str(device.replicas)}
        for name, entry in capacity.items():
            default = str(share[name])
            if device.strict:
                entry["requestPolicy"] = {"default": default, "validValues": [default]}
            elif name == REPLICAS_CAPACITY:
                entry["requestPolicy"] = {"default": default, "validRange": {"min": "1", "step": "1"}}
            else:
                entry["requestPolicy"] = {"default": default}
    if capacity:
        out["capacity"] = capacity
    if device.consumes and device.counter_set is not None:
        out["consumesCounters"] = [{"counterSet": device.counter_set.name,
                                    "counters": {k: {"value": str(v)} for k, v in device.consumes.items()}}]
    if taints:
        out["taints"] = [dict(t) for t in taints]
    return out


def share_capacity(device: DraDevice) -> dict[str, int]:
    """What one claim takes of a shared device by default: one replica, and 1/replicas of each of its
    other capacities (memory in bytes). Under strict shares, the only size its slice offers."""
    share = {name: _number(entry["value"]) // device.replicas for name, entry in device.capacity.items()}
    share[REPLICAS_CAPACITY] = 1
    return share


def _number(text: str) -> int:
    m = _QUANTITY.match(text)
    if m is None:
        raise ValueError(f"not a whole quantity: {text!r}")
    return int(m.group(1)) * _SUFFIX.get(m.group(2) or "", 1)


def slice_content(obj: dict[str, Any]) -> Any:
    """What decides whether a published slice must be rewritten: its spec without the pool's generation,
    with empty fields dropped and quantities as numbers (the API server may write "1M" for "1000000"),
    so a desired and a listed slice compare equal exactly when they publish the same."""
    spec = dict(obj.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    return _normal(spec, "")


def _normal(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        if key == "capacity":
            return {k: _capacity(v) for k, v in value.items()}
        return {k: _normal(v, k) for k, v in value.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_normal(v, key) for v in value]
    return value


def _capacity(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _capacity(v) for k, v in value.items() if v not in (None, {}, [])}
    if isinstance(value, list):  # a request policy's validValues
        return [_capacity(v) for v in value]
    m = _QUANTITY.match(value) if isinstance(value, str) else None
    if m is not None:
        return int(m.group(1)) * _SUFFIX.get(m.group(2) or "", 1)
    return value
