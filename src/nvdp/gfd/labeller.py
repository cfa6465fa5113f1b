"""One labelling pass as a plain function: config + inventory + host facts -> the wanted label set.

The plan is the plugin's own (`nvdp.plan.plan`) under the same config, so the labels say what the
node advertises. A config that cannot apply to the GPUs (the plugin then serves nothing) still
labels the node, without sharing, and the error is returned for the log and the Node's Events.
"""

from __future__ import annotations

from msgspec import Struct

from nvdp.config.model import Config
from nvdp.gfd.labels import HostFacts, gfd_labels
from nvdp.inventory.model import Inventory
from nvdp.plan import PlanError, plan


class Pass(Struct, frozen=True):
    labels: dict[str, str]
    plan_error: str | None = None


def labelling_pass(config: Config, inventory: Inventory, host: HostFacts) -> Pass:
    try:
        node_plan = plan(config, inventory)
        error = None
    except PlanError as e:
        node_plan, error = None, str(e)
    return Pass(gfd_labels(inventory, node_plan, config.flags.mig_strategy, host), error)
