"""What dynamic MIG costs the cluster's scheduler, and when to say so: one message for the DRA plugin's
log and Event (nvdp.dra.scale) and `nvdp doctor` (check dra-mig-scale).

Under migStrategy dynamic a node publishes shared counters and a device per MIG placement (208 on an
8-GPU H100 node). kube-scheduler releases without kubernetes/kubernetes PR #138917 gather, for every
node they check, the counter slices of every node in the cluster and scan them, so once any node
publishes counters every DRA pod costs scheduler CPU growing with the square of the node count
(measured 2026-11-28 with kube-scheduler v1.36.2: docs/dra.md, "Scale"). The API server's version stands
for the control plane's: the scheduler runs the same release, or one minor older.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nvdp.config.model import Config, Mode
from nvdp.dra.pool.devices import DraDevice

# The first Kubernetes release whose kube-scheduler carries kubernetes/kubernetes PR #138917 ("[DRA]
# Partitionable Device Performance Optimization": GatherPools no longer pulls every node's counter
# slices into each node's check). It merged in 2026-05 into the 1.37 cycle (1.36.0 was out on
# 2026-04-22; 1.37's code freeze was 2026-07-22, its release 2026-08-26); no cherry-pick to 1.36 was
# found. The chart's NOTES.txt mirrors this version as a literal (a test keeps them equal).
SCHEDULER_FIX = (1, 37, 0)
SCHEDULER_FIX_TEXT = ".".join(str(n) for n in SCHEDULER_FIX)
SCHEDULER_FIX_PR = "kubernetes/kubernetes#138917"

# The chart value dra.dynamicMigScaleWarning, as the DRA plugin's environment carries it.
SILENCE_ENV = "NVDP_DYNAMIC_MIG_SCALE_WARNING"
SILENCE_VALUE = "dra.dynamicMigScaleWarning"
SCALE_EVENT = "DynamicMigSchedulerCost"


def silenced(env: Mapping[str, str]) -> bool:
    """Whether the warning is switched off: NVDP_DYNAMIC_MIG_SCALE_WARNING=false (or 0, no)."""
    return env.get(SILENCE_ENV, "").strip().lower() in {"false", "0", "no"}


def partitionable(devices: Iterable[DraDevice]) -> int:
    """How many of the pool's devices consume shared counters (0: the scheduler's slow path is not hit)."""
    return sum(1 for device in devices if device.counter_set is not None)


def in_force(config: Config, mode: Mode, devices: Iterable[DraDevice]) -> int:
    """The partitionable devices this node publishes under migStrategy dynamic in DRA mode (0: none, or
    not dynamic MIG)."""
    if config.flags.mig_strategy != "dynamic" or mode != "dra":
        return 0
    return partitionable(devices)


def lacks_fix(release: tuple[int, int, int] | None) -> bool:
    """Whether a control plane of `release` schedules without the fix (None, unknown: not claimed)."""
    return release is not None and release < SCHEDULER_FIX


def scale_warning(version: str, release: tuple[int, int, int] | None, devices: int) -> str | None:
    """The warning for an API server reporting `version` (parsed: `release`) with `devices`
    partitionable devices on this node; None where the control plane has the fix, or its version is
    unknown, or nothing is partitionable."""
    if devices <= 0 or not lacks_fix(release):
        return None
    return (
        f"migStrategy dynamic publishes {devices} partitionable devices (MIG placements, whole GPUs) on this "
        "node, and the API server "
        f"is Kubernetes {version}: kube-scheduler before {SCHEDULER_FIX_TEXT} (without {SCHEDULER_FIX_PR}) "
        "gathers every node's counter slices for each node it checks, so every DRA pod in the cluster costs "
        "scheduler CPU growing with the square of the node count. Measured with kube-scheduler v1.36.2 and "
        "8-GPU H100 nodes (208 devices each): 0.4 / 4.9 / 32.7 s per pod at 50 / 200 / 500 such nodes "
        "(whole GPUs: 8 / 11 / 20 ms); 50 such nodes among 200 held whole-GPU pods elsewhere to 1.7 pods/s "
        f"(114 without). Way out: Kubernetes {SCHEDULER_FIX_TEXT} or later; fewer devices per node with "
        "flags.migDynamicProfiles (e.g. [1g.10gb, 3g.40gb]: less work per node, the same growth); dynamic "
        f"MIG on small clusters only (docs/dra.md, Scale). Silence: {SILENCE_VALUE}=false "
        f"({SILENCE_ENV}=false)."
    )
