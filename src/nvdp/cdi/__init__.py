"""CDI specs: the project's one CDI writer (the device plugin now; a DRA driver later writes its per-claim
specs through the same records and writer).

Data flow, as the rest of nvdp (docs/cdi.md says what the specs hold and why):

```
Config + Inventory         --discover_host()--> HostFacts   (host.py: driver files, nodes; the edge)
Config + Inventory + Plan
  + HostFacts              --build_specs()----> SpecSet     (build.py: pure; one Spec per class)
SpecSet                    --write_specs()----> /var/run/cdi/k8s.device-plugin.nvidia.com-<class>.json
```

`generate` runs the first two. Records are in spec.py (the CDI format) and facts.py (what the host
has); every failure is a CdiError whose message names the cause and the fix.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

# Nothing is imported here at run time: the serving process imports nvdp.cdi.names for Allocate's
# names, and must not load the spec builders with it (tests/footprint).
if TYPE_CHECKING:
    from nvdp.cdi.build import SpecSet
    from nvdp.config.model import Config
    from nvdp.inventory.model import Inventory
    from nvdp.plan.model import Plan

__all__ = ["cdi_enabled", "generate"]


def cdi_enabled(config: Config) -> bool:
    """Whether the plugin hands out CDI names, and so must write specs (a CDI device list strategy)."""
    return bool(config.flags.plugin.cdi_strategies)


def generate(config: Config, inventory: Inventory, plan: Plan, *, dev_root: str | None = None) -> SpecSet:
    """This node's specs: its files and nodes read now, then built for `inventory` and `plan`. What
    discovery left out and why is logged as warnings (logger `nvdp.cdi`). `dev_root`: where the device
    nodes are read when not by the plugin's rule (`nvdp cdi generate` on a host: under --dev-root)."""
    from nvdp.cdi.build import build_specs
    from nvdp.cdi.host import discover_host  # the filesystem edge, loaded only where CDI is on

    facts = discover_host(config, inventory, dev_root=dev_root)
    for warning in facts.warnings:
        logging.getLogger(__name__).warning("CDI: %s", warning)
    return build_specs(config, inventory, plan, facts)
