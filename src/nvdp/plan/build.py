"""`plan(config, inventory)`: the resources a node advertises and the devices behind each.

What we do where NVIDIA's plugin is silent or strict:
- migStrategy none advertises a MIG-enabled GPU as a whole GPU, as NVIDIA does, plus a warning.
- A device matching no resource pattern is left out with its reason instead of stopping the plugin.
- Under mixed, a MIG-enabled GPU without MIG devices is left out with the fix in its reason;
  under single it is an error, as with NVIDIA, since the node would advertise nothing useful.
- A sharing entry naming no resource is reported in Plan.warnings (NVIDIA skips it silently).
- Sharing entries honour `rename` and `devices` (NVIDIA ignores both) and `replicas: 1` means unshared.
"""

from __future__ import annotations

from nvdp.config.model import Config
from nvdp.inventory.model import Inventory
from nvdp.plan.devices import allocate_base
from nvdp.plan.model import Plan
from nvdp.plan.sharing import apply_sharing


def plan(config: Config, inventory: Inventory) -> Plan:
    """Build the node's plan; raises PlanError when the config cannot apply to these GPUs."""
    base = allocate_base(config, inventory)
    warnings = list(base.warnings)
    resources = apply_sharing(config.sharing, base.resources, inventory, warnings)
    excluded = tuple(e for _, e in sorted(base.excluded, key=lambda pair: pair[0]))
    return Plan(resources=tuple(resources), excluded=excluded, warnings=tuple(warnings))
