"""What this node's DRA pool holds under a config, and why it holds nothing.

Config + Inventory -> the node's plan -> its DRA devices, each with the plan's resource name, replicas
and sharing (`pool_devices`); the node's mode decides whether they are published at all
(`published_slices`: none in device-plugin mode, where the DRA plugin deletes its slices); and
`pool_warnings` says why a pool is empty, with the fix. The DRA plugin (nvidia-dra-plugin) serves
these and `nvdp dra slices` prints them, so the preview and the plugin compute alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nvdp.config.model import Config, Mode
from nvdp.config.names import DEFAULT_MODE_ENV as DEFAULT_MODE_ENV
from nvdp.dra.devices import DraDevice, dra_devices, with_plan
from nvdp.dra.slices import desired_slices
from nvdp.inventory.model import Inventory
from nvdp.plan import plan


def pool_devices(config: Config, inventory: Inventory) -> tuple[DraDevice, ...]:
    """Every device the node's pool holds under `config`, in publishing order; raises PlanError when
    the config cannot be applied to these GPUs. The device plugin's plan of the same config gives the
    resource names the extended-resource classes select on and the replicas of GPUs it shares."""
    return with_plan(dra_devices(inventory), plan(config, inventory))


def published_slices(mode: Mode, *, node: str, node_uid: str, driver: str, devices: Sequence[DraDevice],
                     unhealthy: frozenset[str] = frozenset(), generation: int = 1,
                     taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """The ResourceSlices of the node in `mode`: none in device-plugin mode (the device plugin serves
    the GPUs and the DRA plugin deletes its slices), else the pool's slices (`taints`: see
    `desired_slices`)."""
    if mode != "dra":
        return []
    return desired_slices(node=node, node_uid=node_uid, driver=driver, devices=devices,
                          unhealthy=unhealthy, generation=generation, taints=taints)


def env_default_mode(env: Mapping[str, str]) -> tuple[str, str]:
    """How a daemon's default mode is set, and how to make it dra: for `pool_warnings`."""
    raw = env.get(DEFAULT_MODE_ENV, "").strip()
    where = f"{DEFAULT_MODE_ENV}={raw}" if raw else f"{DEFAULT_MODE_ENV} is unset"
    return where, f"{DEFAULT_MODE_ENV}=dra (chart value dra.defaultMode)"


def pool_warnings(config: Config, inventory: Inventory, mode: Mode, *, default_is: str,
                  default_fix: str) -> list[str]:
    """Why the DRA plugin publishes nothing, or nothing for some GPU, each with the fix.

    `default_is` says how the default mode was set ("NVDP_DEFAULT_MODE is unset"), `default_fix` how
    to make it dra ("NVDP_DEFAULT_MODE=dra"): they differ between the plugin and the preview.
    """
    if mode != "dra":
        if config.flags.mode == "device-plugin":
            return [f"This node is in device-plugin mode ({config.source} sets flags.mode: device-plugin): "
                    "the device plugin serves its GPUs and the DRA plugin publishes no ResourceSlices; to "
                    "publish them set flags.mode: dra in that config"]
        source = "the built-in defaults" if config.source == "defaults" else config.source
        return [f"This node is in device-plugin mode ({default_is}; no flags.mode in {source}): the device "
                "plugin serves its GPUs and the DRA plugin publishes no ResourceSlices; to publish them "
                f"set {default_fix}, or flags.mode: dra in the config"]
    if not inventory.gpus:
        return ["This node has no GPUs: its pool is published without devices"]
    return [
        f"GPU {gpu.index} ({gpu.uuid}) has MIG mode enabled and no MIG devices: the DRA plugin publishes "
        "no device for it; create MIG devices on it (nvidia-smi mig -cgi <profiles> -C, or the MIG "
        f"manager), or disable MIG mode (nvidia-smi -i {gpu.index} -mig 0)"
        for gpu in sorted(inventory.gpus, key=lambda g: g.minor)
        if gpu.mig_enabled and not gpu.mig_devices
    ]
