"""What one config puts in force in the DRA plugin: the config, the GPUs, the devices published and
the CDI spec writer of their claims, prepared before anything running is touched; and the claims'
sharing on the node (MPS where the pod has the MPS root), and the writer of their status."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from msgspec import Struct

from nvdp.config.model import Config
from nvdp.daemon.errors import StartupError
from nvdp.dra.claims.cdi_specs import ClaimSpecWriter
from nvdp.dra.pool.contents import Owns
from nvdp.dra.pool.devices import DraDevice
from nvdp.inventory.model import Inventory

if TYPE_CHECKING:
    from nvdp.daemon.pernode.nodeconfig import Chosen
    from nvdp.daemon.report.recording import Recorder
    from nvdp.dra.claims.identity.status import StatusWriter
    from nvdp.dra.claims.mig import ClaimInstances
    from nvdp.dra.claims.sharing.mps import ClaimMps
    from nvdp.dra.claims.sharing.node import NodeSharing


class Serving(Struct, frozen=True):
    """What one config puts in force: the config, GPUs, the devices published, their CDI spec writer."""

    config: Config
    inventory: Inventory
    devices: Mapping[str, DraDevice]
    specs: ClaimSpecWriter


def prepare(config: Config, chosen: Chosen | None, cdi_root: str, log: logging.Logger,
            owns: Owns | None = None, metadata_root: str = "") -> Serving:
    """GPUs, devices and CDI facts for a loaded config; StartupError / NvmlMissing, changing nothing.
    `owns`: whether the plugin made a MIG device for a claim (migStrategy dynamic; its checkpoint);
    `metadata_root`: where the claims' device metadata files go (the plugin's folder on the host)."""
    from nvdp.cdi.errors import CdiError
    from nvdp.cdi.host import discover_host
    from nvdp.daemon.imex import channels_on_node
    from nvdp.daemon.inputs import discover
    from nvdp.dra.pool.contents import pool_devices
    from nvdp.dra.pool.devices import by_name
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
        devices = by_name(pool_devices(config, inventory, owns) if owns else pool_devices(config, inventory))
    except PlanError as err:
        raise StartupError(f"invalid config for this node's GPUs: {err}") from None
    return Serving(config, inventory, devices,
                   ClaimSpecWriter(cdi_root, config, inventory, facts, metadata_root))


def node_sharing(client: Any, serving: Serving, env: Mapping[str, str], driver: str, node: str,
                 log: logging.Logger, recorder: Recorder) -> tuple[NodeSharing, ClaimMps | None]:
    """Claims' sharing on this node, and its MPS daemons when the pod has the MPS root (chart value
    dra.mps)."""
    from nvdp.dra.claims.sharing.events import ClaimEvents
    from nvdp.dra.claims.sharing.mps import MPS_RUNNER_ENV, RUNNER, ClaimMps
    from nvdp.dra.claims.sharing.node import NodeSharing
    from nvdp.mps.paths import CONTAINER_ROOT_ENV, HOST_ROOT_ENV, container_root

    config = serving.config
    warner = ClaimEvents(client, node=node, component="nvidia-dra-plugin", log=log)
    if not (env.get(HOST_ROOT_ENV) or env.get(CONTAINER_ROOT_ENV)):
        return NodeSharing(driver=driver, mps=None, log=log, warner=warner, no_mps_reason=(
            f"the pod has no MPS root ({HOST_ROOT_ENV} is not set): install with the chart value "
            "dra.mps=true (the default), which mounts it and the MPS clients' /dev/shm")), None
    mps = ClaimMps(root=container_root(env), host_root=env.get(HOST_ROOT_ENV) or config.flags.mps_root,
                   driver=driver, inventory=serving.inventory, log=log,
                   runner=env.get(MPS_RUNNER_ENV) or RUNNER)
    return NodeSharing(driver=driver, mps=mps, log=log, no_mps_reason="", warner=warner), mps


def claim_instances(serving: Serving | None, log: logging.Logger) -> ClaimInstances:
    """The MIG devices made for claims (migStrategy dynamic), through NVML on the config's driver."""
    from nvdp.dra.claims.mig import ClaimInstances
    from nvdp.inventory.mig_control import MigControl

    assert serving is not None
    flags = serving.config.flags
    return ClaimInstances(MigControl(flags.nvidia_driver_root, flags.plugin.container_driver_root), log)


# The API server's answers that a second try does not change: no right to write (403), the claim gone
# (404), an entry it does not accept (422).
_REFUSED_FOR_GOOD = frozenset({403, 404, 422})


def claim_status(client: Any, driver: str) -> StatusWriter:
    """Writes this driver's entries of a claim's status.devices (server-side apply); StatusRefused
    where trying again cannot help."""
    from nvdp.dra.claims.identity.status import StatusRefused
    from nvdp.kube import apply_device_status, classify

    def write(namespace: str, name: str, entries: list[dict[str, Any]]) -> None:
        try:
            apply_device_status(client, namespace, name, driver=driver, devices=entries)
        except Exception as err:
            failure = classify(err)
            if failure.kind != "status" or failure.code not in _REFUSED_FOR_GOOD:
                raise
            hint = (" (the chart grants the DRA plugin's account resourceclaims/status patch with "
                    "dra.enabled)" if failure.code == 403 else "")
            raise StatusRefused(f"{failure.code} {failure.detail}{hint}") from None

    return write


def foreign_report(serving: Serving, checkpoint: str) -> tuple[frozenset[str], str]:
    """migStrategy dynamic: the MIG devices the plugin did not make (by its checkpoint), and the
    Warning Event's message about them ("" when there are none)."""
    from nvdp.dra.claims.checkpoint import read_owned_mig
    from nvdp.dra.pool.contents import foreign_instances

    if serving.config.flags.mig_strategy != "dynamic":
        return frozenset(), ""
    foreign = foreign_instances(serving.inventory, read_owned_mig(checkpoint).owns)
    seen = frozenset(m.uuid for migs in foreign.values() for m in migs)
    if not seen:
        return seen, ""
    listed = "; ".join(f"GPU {gpu}: {', '.join(f'{m.profile} {m.uuid}' for m in migs)}"
                       for gpu, migs in foreign.items())
    return seen, (f"MIG devices the DRA plugin did not make are kept and their placements are not "
                  f"published ({listed}); delete them (nvidia-smi mig -dci / -dgi) to publish those "
                  "placements again")
