"""What this node's DRA pool holds under a config, and why it holds nothing.

Config + Inventory -> the node's plan -> its DRA devices, each with the plan's resource name, replicas
and sharing (`pool_devices`); the node's mode decides whether they are published at all
(`published_slices`: none in device-plugin mode, where the DRA plugin deletes its slices); and
`pool_warnings` says why a pool is empty, with the fix. The DRA plugin (nvidia-dra-plugin) serves
these and `nvdp dra slices` prints them, so the preview and the plugin compute alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nvdp.config.model import Config, Mode
from nvdp.config.names import DEFAULT_MODE_ENV as DEFAULT_MODE_ENV
from nvdp.dra.pool.devices import DraDevice, dra_devices, with_plan
from nvdp.dra.pool.partitions import Offers, dynamic_devices, offer_problem, partitions_published
from nvdp.dra.pool.slices import desired_slices
from nvdp.inventory.model import Inventory, MigDevice
from nvdp.plan import PlanError, plan

# Whether the DRA plugin made a MIG device for a claim (its checkpoint: nvdp.dra.claims.records.OwnedMig).
Owns = Callable[[MigDevice], bool]


def _owns_none(mig: MigDevice) -> bool:
    return False


def pool_devices(config: Config, inventory: Inventory, owns: Owns = _owns_none) -> tuple[DraDevice, ...]:
    """Every device the node's pool holds under `config`, in publishing order; raises PlanError when
    the config cannot be applied to these GPUs. The device plugin's plan of the same config gives the
    resource names the extended-resource classes select on and the replicas of GPUs it shares.

    Under migStrategy dynamic the MIG-capable GPUs publish their possible placements
    (nvdp.dra.pool.partitions); `owns` tells the MIG devices the DRA plugin made for its claims (its
    checkpoint): every other MIG device is foreign, and its placements are left out. Only the placements
    flags.migDynamicProfiles offers are published; a name it gives that no MIG-capable GPU of the node
    has is a PlanError naming the valid ones."""
    if config.flags.mig_strategy == "dynamic":
        offers = Offers(config.flags.mig_dynamic_profiles)
        problem = offer_problem(inventory, offers)
        if problem is not None:
            raise PlanError(problem)
        devices = dynamic_devices(inventory, foreign_instances(inventory, owns), offers)
    else:
        devices = dra_devices(inventory)
    return with_plan(devices, plan(config, inventory))


def foreign_instances(inventory: Inventory, owns: Owns = _owns_none) -> dict[str, list[MigDevice]]:
    """By GPU UUID, the MIG devices that exist and that the DRA plugin did not make."""
    return {gpu.uuid: foreign for gpu in inventory.gpus
            if (foreign := [m for m in gpu.mig_devices if not owns(m)])}


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
    if config.flags.mig_strategy == "dynamic":
        offers = Offers(config.flags.mig_dynamic_profiles)
        return dynamic_warnings(inventory, foreign_instances(inventory), offers)
    return [
        f"GPU {gpu.index} ({gpu.uuid}) has MIG mode enabled and no MIG devices: the DRA plugin publishes "
        "no device for it; create MIG devices on it (nvidia-smi mig -cgi <profiles> -C, or the MIG "
        f"manager), or disable MIG mode (nvidia-smi -i {gpu.index} -mig 0)"
        for gpu in sorted(inventory.gpus, key=lambda g: g.minor)
        if gpu.mig_enabled and not gpu.mig_devices
    ]


def dynamic_warnings(inventory: Inventory, foreign: Mapping[str, Sequence[MigDevice]],
                     offers: Offers | None = None) -> list[str]:
    """Under migStrategy dynamic: GPUs that publish no MIG placement, or only some, and why, with the fix
    (`offers`: flags.migDynamicProfiles)."""
    out: list[str] = []
    offers = offers or Offers(None)
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        if not gpu.mig_capable:
            continue
        if gpu.mig_profiles and not any(offers.offers(p, start) for p in gpu.mig_profiles
                                        for start, _ in p.placements):
            out.append(f"GPU {gpu.index} ({gpu.uuid}) has none of the MIG profiles flags.migDynamicProfiles "
                       f"offers ({offers.describe()}): it publishes no MIG placement; add one of its "
                       f"profiles ({', '.join(p.name for p in gpu.mig_profiles)}) to the list")
        if not gpu.mig_profiles:
            out.append(f"GPU {gpu.index} ({gpu.uuid}) is MIG capable, but NVML reported no GPU-instance "
                       "profiles for it: it is published whole only; check the driver (R450 or later for "
                       "A100/H100) and that the plugin can read MIG facts (nvdp doctor)")
        elif not partitions_published(gpu):
            out.append(f"GPU {gpu.index} ({gpu.uuid}, {gpu.architecture or 'unknown architecture'}) has "
                       "MIG mode off, and switching it needs a GPU reset on this architecture: it is "
                       "published whole only. To make MIG devices on demand enable MIG mode once "
                       f"(nvidia-smi -i {gpu.index} -mig 1, with no process on the GPU) and restart the "
                       "plugin")
        mine = foreign.get(gpu.uuid, ())
        if mine:
            listed = ", ".join(f"{m.profile} {m.uuid}" for m in mine)
            out.append(f"GPU {gpu.index} ({gpu.uuid}) has MIG devices the DRA plugin did not make "
                       f"({listed}): they are never destroyed, and their placements (and the whole GPU) "
                       "are not published; delete them (nvidia-smi mig -dci / -dgi) to publish those "
                       "placements")
    return out
