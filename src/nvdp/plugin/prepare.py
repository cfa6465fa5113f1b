"""What the plugin will serve, prepared before anything running is touched: config, GPUs, plan, CDI specs.

`prepare` runs the first stages of the data flow (config + flags -> Config, NVML -> Inventory,
Config + Inventory -> Plan, and with a CDI strategy Config + Inventory + Plan + the driver's files ->
SpecSet) and the serving-side check that each planned device list fits the kubelet's message limit.
It changes nothing: a reload that fails here leaves the running resources (and the spec files) as
they are.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from msgspec import Struct

from nvdp.config.model import Config, Mode
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan
from nvdp.plugin.errors import NvmlMissing, StartupError
from nvdp.plugin.imex import channels_on_node

if TYPE_CHECKING:
    from nvdp.cdi.build import SpecSet

__all__ = ["NvmlMissing", "Prepared", "StartupError", "discover", "idle", "load_config", "make_plan",
           "prepare"]


class Prepared(Struct, frozen=True):
    config: Config
    inventory: Inventory
    plan: Plan
    cdi: SpecSet | None = None  # the CDI specs to write; None without a CDI strategy
    mode: Mode = "device-plugin"  # the node's mode under `config` (nvdp.mode)
    # Why nothing is advertised, when nothing is on purpose: the node is in DRA mode, or the device
    # plugin waits for the DRA plugin to let go of the GPUs. None: the plan is served.
    idle: str | None = None


def idle(config: Config, mode: Mode, why: str) -> Prepared:
    """A config that advertises nothing (no GPUs read, no plan, no CDI specs), for `why`."""
    return Prepared(config, Inventory(driver_version="", cuda_driver_version=""), Plan(), None, mode, why)


def load_config(args: argparse.Namespace, env: Mapping[str, str], entry: Path | None,
                per_node: bool) -> Config:
    """The config from flags, env and a file: `entry` in per-node mode (never CONFIG_FILE), else
    CONFIG_FILE."""
    from nvdp.config.flags import overrides_from_args
    from nvdp.config.loader import ConfigError, entry_in_force
    from nvdp.config.loader import load_config as load

    path, env = entry_in_force(args.config_file, env, entry, per_node=per_node)
    try:
        return load(path, env, overrides_from_args(args))
    except ConfigError as err:
        raise StartupError(str(err)) from None


def discover(config: Config) -> Inventory:
    from nvdp.inventory.nvml import NvmlUnavailable
    from nvdp.inventory.nvml import discover as read_gpus

    try:
        return read_gpus(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)
    except NvmlUnavailable as err:
        missing = NvmlMissing(str(err))
        missing.fail = config.flags.fail_on_init_error
        raise missing from None


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
