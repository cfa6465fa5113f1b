"""The resource plan: Config + Inventory -> which resources a node advertises."""

from __future__ import annotations

from nvdp.plan.build import plan
from nvdp.plan.errors import PlanError
from nvdp.plan.model import Exclusion, Plan, PlannedDevice, PlannedResource

__all__ = [
    "Exclusion",
    "Plan",
    "PlanError",
    "PlannedDevice",
    "PlannedResource",
    "plan",
]
