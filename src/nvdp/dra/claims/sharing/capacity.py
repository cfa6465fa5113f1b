"""The capacity the scheduler allocated a claim from shared devices, and the MPS limits it maps to.

Consumable capacity (KEP-5075): a claim on a shared device consumes one or more `replicas` of it and
part of its `memory` (`consumedCapacity` in its allocation results). Of a GPU shared N ways, r replicas
are r/N of its threads and the memory is the pinned-memory limit. The default share, one replica and
1/N of the memory, is what `nvdp.dra.pool.slices.share_capacity` publishes as the request policy's
default, so it maps to the node's 1/N split, and under strict shares to the one share every claim gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvdp.claim_results import allocation_results, result_field
from nvdp.dra.claims.check import ClaimProblem
from nvdp.dra.claims.sharing.gpuconfig import MpsLimits
from nvdp.dra.claims.sharing.quantity import QuantityError, quantity_value
from nvdp.dra.pool.devices import MIB, DraDevice
from nvdp.dra.pool.slices import REPLICAS_CAPACITY, share_capacity


def consumed_capacity(claim: Mapping[str, Any], driver: str) -> dict[str, dict[str, int]]:
    """The capacity the scheduler allocated the claim from each device of `driver` (consumable
    capacity: `consumedCapacity` in its allocation results), by device name; summed over the results
    naming one device. ClaimProblem naming the field when a value is not a quantity."""
    found: dict[str, dict[str, int]] = {}
    for i, result in allocation_results(claim):
        consumed = result.get("consumedCapacity")
        if not isinstance(consumed, Mapping) or result.get("driver") != driver:
            continue
        device = found.setdefault(str(result.get("device", "")), {})
        for name, value in consumed.items():
            try:
                amount = quantity_value(value)
            except (QuantityError, TypeError) as err:
                raise ClaimProblem(f"{result_field(i, 'consumedCapacity')}.{name}: "
                                   f"{err}; the claim must be allocated again") from None
            device[str(name)] = device.get(str(name), 0) + amount
    return found


def capacity_limits(device: DraDevice, consumed: Mapping[str, int]) -> MpsLimits:
    """The MPS limits a device's allocated capacity maps to: `memory` as its pinned-memory limit,
    `replicas` r of the device's N as r/N of the threads (at least 1%)."""
    memory = consumed.get("memory")
    replicas = consumed.get(REPLICAS_CAPACITY)
    threads = None
    if replicas is not None and device.replicas > 1:
        threads = min(100, max(1, 100 * replicas // device.replicas))
    mib = max(1, memory // MIB) if memory else None
    return MpsLimits(active_thread_percentage=threads, pinned_memory_limit_mib=mib)


def share_limits(device: DraDevice) -> MpsLimits:
    """The MPS limits of one default share of a shared GPU: 1/N of its threads and of its memory."""
    return capacity_limits(device, share_capacity(device))
