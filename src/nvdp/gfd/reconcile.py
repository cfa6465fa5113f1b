"""Which Node label changes bring a Node to the wanted GPU feature discovery labels (pure).

The labeller owns exactly the keys NVIDIA's GPU feature discovery can write and its own health labels
(`owns`), so it removes those it no longer produces and never touches any other label, `nvidia.com/*`
or not (the config selector `nvidia.com/device-plugin.config`, `nvidia.com/gpu.present`, the GPU
operator's keys, ...).
It compares with what the Node carries and asks for no write when nothing but the timestamp would
change: `gfd.timestamp` says when the label set last changed, not when it was last checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nvdp.gfd.labels import TIMESTAMP

_RESOURCE_SUFFIXES = (
    r"product|count|replicas|sharing-strategy|memory|multiprocessors|slices\.gi|slices\.ci"
    r"|engines\.(copy|decoder|encoder|jpeg|ofa)"
)
_OWNED = re.compile(
    r"nvidia\.com/("
    r"gfd\.timestamp"
    r"|cuda\.(driver|runtime|driver-version|runtime-version)\.(major|minor|rev|revision|full)"
    r"|gpu\.(machine|mode|family|compute\.major|compute\.minor)"
    r"|mig\.capable|mig\.strategy|mps\.capable|gpu\.clique"
    r"|gpu\.(unhealthy|needs-service)"  # ours: the plugin's health record
    r"|vgpu\.(present|host-driver-version|host-driver-branch)"
    rf"|gpu\.({_RESOURCE_SUFFIXES})"
    # MIG profiles as label keys: "+" became "." ("1g.10gb.me", "1g.24gb.me.all"); Blackwell's "-me"
    # stays ("1g.24gb-me").
    rf"|mig-[0-9a-z][0-9a-z.-]*\.({_RESOURCE_SUFFIXES})"
    r")"
)

LabelChanges = dict[str, "str | None"]  # value to set, or None to remove


def owns(key: str) -> bool:
    """True for the keys GPU feature discovery writes; the labeller leaves every other key alone."""
    return _OWNED.fullmatch(key) is not None


def label_changes(current: Mapping[str, str], wanted: Mapping[str, str], now: int | None) -> LabelChanges:
    """The merge-patch labels that turn the owned part of `current` into `wanted` (empty: no write).

    `wanted` has no timestamp; `now` (unix seconds, or None for noTimestamp) stamps a set that changed.
    """
    owned = {k: v for k, v in current.items() if owns(k) and k != TIMESTAMP}
    changes: LabelChanges = {k: v for k, v in wanted.items() if owned.get(k) != v}
    changes.update({k: None for k in owned if k not in wanted})
    if now is None or not wanted:  # noTimestamp, or no GPUs (any more): nothing to date
        if TIMESTAMP in current:
            changes[TIMESTAMP] = None
    elif changes or TIMESTAMP not in current:
        changes[TIMESTAMP] = str(now)
    return changes


def apply_changes(current: Mapping[str, str], changes: LabelChanges) -> dict[str, str]:
    """The labels a Node has after a merge patch of `changes` (for tests and the file output)."""
    out = {k: v for k, v in current.items() if changes.get(k, v) is not None}
    out.update({k: v for k, v in changes.items() if v is not None})
    return out
