"""Every Kubernetes Event reason nvdp records: the object it goes on and the daemons that record it.

One table, so that a reason is chosen once and on purpose: `nvdp.daemon.report.recording.Recorder` (Node
Events) and
`nvdp.dra.claims.sharing.events.ClaimEvents` (Events on ResourceClaims) refuse a reason that is not declared
here for their object, with an ERROR naming this table. A test reads every reason used in src/ and
checks it against the table, both ways.

`owners` are the daemons that record the reason (NodeEvents' `component`, the Event's
`source.component`): a daemon's Recorder (nvdp.daemon.report.recording, built by the daemon skeleton with the
daemon's name) records only the reasons it owns, so every daemon reports its node's config and mode
through the same code and this table decides who tells. Where two owners of a node could tell the
same thing at one moment, the code makes one of them say it (`notify=False` for the other: a config
refused under per-node config, which the per-node config reports; a mode switch refused, which the
daemon whose mode is in force reports).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, NamedTuple

DEVICE_PLUGIN = "nvidia-device-plugin"
DRA_PLUGIN = "nvidia-dra-plugin"
FEATURE_DISCOVERY = "gpu-feature-discovery"
DAEMONS = frozenset({DEVICE_PLUGIN, DRA_PLUGIN, FEATURE_DISCOVERY})

On = Literal["Node", "ResourceClaim"]


class Reason(NamedTuple):
    owners: frozenset[str]
    meaning: str
    on: On = "Node"


_PLUGINS = frozenset({DEVICE_PLUGIN, DRA_PLUGIN})
_NODE_CONFIG = DAEMONS  # every daemon that follows the per-node config label and records Events
_DP = frozenset({DEVICE_PLUGIN})
_DRA = frozenset({DRA_PLUGIN})

REASONS: Mapping[str, Reason] = MappingProxyType({
    # GPU health (nvdp.daemon.health, through Recorder.health_changed)
    "GPUUnhealthy": Reason(_PLUGINS, "a GPU's devices went Unhealthy (a critical XID, a lost GPU)"),
    "GPUFlapping": Reason(_PLUGINS, "a GPU that keeps failing is held down"),
    "GPURecoveryBlocked": Reason(_PLUGINS, "a re-check keeps a GPU down"),
    "GPUHealthy": Reason(_PLUGINS, "a GPU came back"),
    "GPUCleared": Reason(_PLUGINS, "a GPU was cleared by hand"),
    # Configuration (Recorder.config_applied / config_refused; nvdp.daemon.pernode.nodechoice,
    # nvdp.daemon.pernode.nodeconfig)
    "ConfigApplied": Reason(_NODE_CONFIG, "a new configuration or config entry is served"),
    "ConfigRefused": Reason(_DP, "a reloaded config file is invalid; the previous one keeps serving"),
    "InvalidConfig": Reason(_NODE_CONFIG, "the config entry the node label chose is invalid"),
    "UnknownConfig": Reason(_NODE_CONFIG, "the node label names no config entry"),
    "ConfigSelectionFailed": Reason(_NODE_CONFIG, "the config entries cannot be read or chosen from"),
    "ConfigPending": Reason(_PLUGINS, "the chosen entry cannot be put in force yet; tried again"),
    # The node's mode (nvdp.daemon.pernode.mode)
    "ModeSwitchRefused": Reason(_PLUGINS, "a mode switch waits while pods use the node's GPUs"),
    "ModeSwitched": Reason(_PLUGINS, "the node is served by the other API now"),
    # MPS (nvdp.plugin.mps_gate, through Recorder.mps_ready)
    "MPSDaemonNotReady": Reason(_DP, "an MPS resource waits for its control daemon"),
    "MPSDaemonReady": Reason(_DP, "the MPS control daemon answers after a wait"),
    "MPSUpgradeWaiting": Reason(
        _PLUGINS, "a new MPS daemon pod waits to take over until no pod of its node uses MPS "
        "(nvdp.mps.node.handover)"),
    # The DRA plugin (nvdp.dra)
    "CheckpointSetAside": Reason(_DRA, "an unreadable checkpoint was set aside and rebuilt"),
    "ForeignMigDevices": Reason(
        _DRA, "migStrategy dynamic: MIG devices nvdp did not make are kept and their placements unpublished"),
    "DynamicMigSchedulerCost": Reason(
        _DRA, "migStrategy dynamic on a control plane whose kube-scheduler lacks the partitionable-devices "
        "fix (nvdp.dra.pool.scale): once per start"),
    "ResourceSlicePublishFailed": Reason(_DRA, "the node's ResourceSlices cannot be published"),
    "DeviceTaintsUnsupported": Reason(
        _DRA, "the API server drops device taints: down GPUs leave the pool instead of being tainted"),
    "ClaimConfigDriverMismatch": Reason(
        _DRA, "a claim config names a near miss of the driver's name and is ignored", on="ResourceClaim"),
})


def owns(daemon: str | None, reason: str) -> bool:
    """Whether `daemon` records `reason` (None: any daemon, for a Recorder without an owner)."""
    found = REASONS.get(reason)
    return found is not None and (daemon is None or daemon in found.owners)


def undeclared(reason: str, on: On) -> str | None:
    """Why `reason` may not be recorded on an object of kind `on` (None: it may)."""
    found = REASONS.get(reason)
    if found is None:
        return f"Event reason {reason!r} is not declared in nvdp.daemon.report.event_reasons.REASONS"
    if found.on != on:
        return (f"Event reason {reason!r} is declared for a {found.on}, not a {on} "
                "(nvdp.daemon.report.event_reasons)")
    return None
