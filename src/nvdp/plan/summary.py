"""The plan as table rows and as JSON-ready data, for `nvdp plan` and for logs."""

from __future__ import annotations

from typing import TypedDict

from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan, PlannedDevice, PlannedResource
from nvdp.text import columns


class SummaryRow(TypedDict):
    resource: str
    count: int  # what the kubelet sees as capacity
    devices: int  # physical GPUs or MIG devices behind it
    gpus: str  # "0-3 NVIDIA A100-SXM4-40GB, 4 Tesla T4"
    sharing: str  # "none", "time-slicing x10", "mps x4"


def sharing_label(resource: PlannedResource) -> str:
    if resource.sharing == "none":
        return "none"
    return f"{resource.sharing} x{resource.replicas}"


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def describe_gpus(devices: tuple[PlannedDevice, ...], inventory: Inventory | None = None) -> str:
    """GPU indices, runs of the same model collapsed: "0-3 NVIDIA A100-SXM4-40GB, 4 Tesla T4"."""
    by_index = {i: u for d in devices for i, u in zip(d.gpu_indices, d.gpu_uuids, strict=True)}
    groups: list[tuple[str, list[int]]] = []
    for index in sorted(by_index):
        gpu = inventory.gpu(by_index[index]) if inventory is not None else None
        model = gpu.name if gpu is not None else ""
        if groups and groups[-1][0] == model:
            groups[-1][1].append(index)
        else:
            groups.append((model, [index]))
    return ", ".join(f"{_ranges(idx)} {model}".rstrip() for model, idx in groups)


def plan_summary_rows(plan: Plan, inventory: Inventory | None = None) -> list[SummaryRow]:
    """One row per advertised resource; GPU models come from `inventory` when given."""
    return [
        SummaryRow(
            resource=r.name,
            count=len(r.devices),
            devices=len({d.base_id for d in r.devices}),
            gpus=describe_gpus(r.devices, inventory),
            sharing=sharing_label(r),
        )
        for r in plan.resources
    ]


def _device_dict(d: PlannedDevice) -> dict[str, object]:
    return {
        "id": d.id,
        "base_id": d.base_id,
        "index": d.index,
        "gpu_uuids": list(d.gpu_uuids),
        "gpu_indices": list(d.gpu_indices),
        "minors": list(d.minors),
        "numa_node": d.numa_node,
        "memory_bytes": d.memory_bytes,
        "replica": d.replica,
        "mig": None if d.mig is None else {"gi": d.mig[0], "ci": d.mig[1]},
        "healthy": d.healthy,
    }


def plan_to_dict(plan: Plan, inventory: Inventory | None = None) -> dict[str, object]:
    """Everything the table shows plus each resource's devices, as JSON-ready data."""
    rows = {row["resource"]: row for row in plan_summary_rows(plan, inventory)}
    return {
        "resources": [
            {
                "name": r.name,
                "count": rows[r.name]["count"],
                "gpus": rows[r.name]["gpus"],
                "sharing": r.sharing,
                "replicas": r.replicas,
                "source_name": r.source_name,
                "fail_requests_greater_than_one": r.fail_requests_greater_than_one,
                "devices": [_device_dict(d) for d in r.devices],
            }
            for r in plan.resources
        ],
        "warnings": list(plan.warnings),
        "excluded": [{"device": e.device, "reason": e.reason} for e in plan.excluded],
    }


def render_table(rows: list[SummaryRow]) -> list[str]:
    """Left-aligned columns, two spaces apart, under an upper-case header."""
    return columns(("RESOURCE", "COUNT", "DEVICES", "GPUS", "SHARING"), (
        (r["resource"], str(r["count"]), str(r["devices"]), r["gpus"], r["sharing"]) for r in rows))
