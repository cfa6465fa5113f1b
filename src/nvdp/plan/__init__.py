"""The resource plan: Config + Inventory -> which resources a node advertises."""

from __future__ import annotations

from nvdp.plan.build import plan
from nvdp.plan.errors import PlanError, UnknownDeviceError
from nvdp.plan.ids import container_device_ids
from nvdp.plan.model import Exclusion, Plan, PlannedDevice, PlannedResource

__all__ = [
    "Exclusion",
    "Plan",
    "PlanError",
    "PlannedDevice",
    "PlannedResource",
    "UnknownDeviceError",
    "container_device_ids",
    "plan",
]
