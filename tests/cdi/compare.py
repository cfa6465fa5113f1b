"""Comparing two CDI specs entry by entry, whatever the order, for the golden tests."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EDIT_FIELDS = ("env", "deviceNodes", "hooks", "mounts", "additionalGids")


@dataclass
class Tally:
    """What a comparison covered: devices, and entries of edits (one env string, node, hook, mount...)."""

    devices: int = 0
    entries: int = 0
    differences: list[str] = field(default_factory=list)


def _canonical(items: Iterable[Any]) -> list[str]:
    return sorted(json.dumps(item, sort_keys=True) for item in items)


def compare_edits(where: str, theirs: dict[str, Any], ours: dict[str, Any], tally: Tally) -> None:
    for name in sorted(set(theirs) | set(ours)):
        if name not in EDIT_FIELDS:
            tally.differences.append(f"{where}: unexpected field {name}")
            continue
        a, b = _canonical(theirs.get(name, [])), _canonical(ours.get(name, []))
        tally.entries += max(len(a), len(b))
        for entry in sorted(set(a) - set(b)):
            tally.differences.append(f"{where}.{name}: NVIDIA has {entry}, nvdp has not")
        for entry in sorted(set(b) - set(a)):
            tally.differences.append(f"{where}.{name}: nvdp has {entry}, NVIDIA has not")


def compare_spec(cls: str, theirs: dict[str, Any], ours: dict[str, Any], tally: Tally) -> None:
    for key in ("cdiVersion", "kind"):
        if theirs.get(key) != ours.get(key):
            tally.differences.append(f"{cls}.{key}: NVIDIA {theirs.get(key)!r}, nvdp {ours.get(key)!r}")
    compare_edits(f"{cls} common", theirs.get("containerEdits", {}), ours.get("containerEdits", {}), tally)
    their_devices = {d["name"]: d for d in theirs["devices"]}
    our_devices = {d["name"]: d for d in ours["devices"]}
    for name in sorted(set(their_devices) ^ set(our_devices)):
        side = "NVIDIA" if name in their_devices else "nvdp"
        tally.differences.append(f"{cls}: device {name} only in {side}'s spec")
    for name in sorted(set(their_devices) & set(our_devices)):
        tally.devices += 1
        compare_edits(f"{cls} device {name}", their_devices[name]["containerEdits"],
                      our_devices[name]["containerEdits"], tally)
    if [d["name"] for d in ours["devices"]] != sorted(our_devices):
        tally.differences.append(f"{cls}: nvdp's devices are not sorted by name")
