"""What one config puts in force in the DRA plugin: the config, the GPUs, the devices published and
the CDI spec writer of their claims, prepared before anything running is touched."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from msgspec import Struct

from nvdp.config.model import Config
from nvdp.daemon.errors import StartupError
from nvdp.dra.cdi_specs import ClaimSpecWriter
from nvdp.dra.devices import DraDevice
from nvdp.inventory.model import Inventory

if TYPE_CHECKING:
    from nvdp.nodeconfig import Chosen


class Serving(Struct, frozen=True):
    """What one config puts in force: the config, GPUs, the devices published, their CDI spec writer."""

    config: Config
    inventory: Inventory
    devices: Mapping[str, DraDevice]
    specs: ClaimSpecWriter


def prepare(config: Config, chosen: Chosen | None, cdi_root: str, log: logging.Logger) -> Serving:
    """GPUs, devices and CDI facts for a loaded config; StartupError / NvmlMissing, changing nothing."""
    from nvdp.cdi.errors import CdiError
    from nvdp.cdi.host import discover_host
    from nvdp.daemon.imex import channels_on_node
    from nvdp.daemon.inputs import discover
    from nvdp.dra.devices import by_name
    from nvdp.dra.pool import pool_devices
    from nvdp.plan import PlanError

    log.info("Configuration from %s%s", config.source, f", {chosen.describe()}" if chosen else "")
    inventory = discover(config)
    config = channels_on_node(config)
    try:
        facts = discover_host(config, inventory)
    except CdiError as err:
        raise StartupError(f"cannot make CDI specs for this node's claims: {err}") from None
    for warning in facts.warnings:
        log.warning("CDI: %s", warning)
    try:
        devices = by_name(pool_devices(config, inventory))
    except PlanError as err:
        raise StartupError(f"invalid config for this node's GPUs: {err}") from None
    return Serving(config, inventory, devices, ClaimSpecWriter(cdi_root, config, inventory, facts))
