"""A ResourceClaim's allocation results (`status.allocation.devices.results`): the one reader of that path.

Pure and import-free, below every daemon: the DRA plugin reads its results from here (which devices a
claim holds, their capacity), and so does the per-node mode policy (which pods hold a node's GPUs),
which the MPS daemon and GPU feature discovery use without importing the DRA plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESULTS_FIELD = "status.allocation.devices.results"


def allocation_results(claim: Mapping[str, Any] | None) -> list[tuple[int, Mapping[str, Any]]]:
    """(index, result) for each result of the claim's allocation, in the scheduler's order; none for a
    claim not allocated. The index names the entry in an error (`status.allocation.devices.results[i]`)."""
    allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return []
    return [(i, result) for i, result in enumerate(results) if isinstance(result, Mapping)]


def result_field(index: int, name: str = "") -> str:
    """The field path of result `index` (and its `name`), for messages."""
    return f"{RESULTS_FIELD}[{index}]" + (f".{name}" if name else "")
