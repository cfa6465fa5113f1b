"""What the plugin will serve, prepared before anything running is touched: config, GPUs, plan, CDI specs.

`prepare` runs the first stages of the data flow (config + flags -> Config, NVML -> Inventory,
Config + Inventory -> Plan, and with a CDI strategy Config + Inventory + Plan + the driver's files ->
SpecSet) and the serving-side check that each planned device list fits the kubelet's message limit.
It changes nothing: a reload that fails here leaves the running resources (and the spec files) as
they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgspec import Struct

from nvdp.config.model import Config, Mode
from nvdp.daemon.errors import NvmlMissing, StartupError
from nvdp.daemon.imex import channels_on_node
from nvdp.daemon.inputs import discover, load_config
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan

if TYPE_CHECKING:
    from nvdp.cdi.build import SpecSet

__all__ = ["NvmlMissing", "Prepared", "StartupError", "discover", "idle", "load_config", "make_plan",
           "prepare"]


class Prepared(Struct, frozen=True):
    config: Config
    inventory: Inventory
    plan: Plan
    cdi: SpecSet | None = None  # the CDI specs to write; None without a CDI strategy
    mode: Mode = "device-plugin"  # the node's mode under `config` (nvdp.daemon.pernode.mode)
    # Why nothing is advertised, when nothing is on purpose: the node is in DRA mode, or the device
    # plugin waits for the DRA plugin to let go of the GPUs. None: the plan is served.
    idle: str | None = None


def idle(config: Config, mode: Mode, why: str) -> Prepared:
    """A config that advertises nothing (no GPUs read, no plan, no CDI specs), for `why`."""
    return Prepared(config, Inventory(driver_version="", cuda_driver_version=""), Plan(), None, mode, why)


def make_plan(config: Config, inventory: Inventory) -> Plan:
    from nvdp.plan import PlanError, plan
    from nvdp.plugin.wire import oversized

    try:
        planned = plan(config, inventory)
    except PlanError as err:
        raise StartupError(f"the configuration cannot be applied to this node's GPUs: {err}") from None
    too_big = [reason for reason in map(oversized, planned.resources) if reason]
    if too_big:
        raise StartupError("the configuration cannot be served on this node: " + "; ".join(too_big))
    return planned


def prepare(config: Config) -> Prepared:
    """GPUs, plan and CDI specs for a loaded config; raises StartupError or NvmlMissing."""
    from nvdp.plugin.cdi_specs import build

    inventory = discover(config)
    config = channels_on_node(config)  # a required IMEX channel missing stops here; missing ones go
    planned = make_plan(config, inventory)
    return Prepared(config, inventory, planned, build(config, inventory, planned))
