"""Claim configs addressed to a driver name close to this driver's: most likely a typo.

DRA hands each driver only the opaque configs naming it, and a driver ignores the others' without a
word (a claim can mix drivers). So a config for `gpu.nvidia.co` is dropped silently and the claim is
prepared without its sharing. `near_miss_configs` (pure) finds such configs in a claim, naming the
field; the DRA plugin records them as a Warning Event on the claim (nvdp.dra.claims.sharing.events).

A near miss: not this driver's name and not another real driver's (KNOWN_DRIVERS), but equal to it
ignoring case, at most two typos away (one for names under 8 characters), or one of the names taken
for it (MISTAKEN_NAMES).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvdp.config.names import DEFAULT_DRA_DRIVER

# Real DRA drivers: a config naming one of them is that driver's, however close its name is to this
# driver's (NVIDIA's ComputeDomain driver runs beside the GPU driver on the same claims' nodes).
KNOWN_DRIVERS = frozenset({DEFAULT_DRA_DRIVER, "compute-domain.nvidia.com"})
# Names that no DRA driver has but that are mistaken for the GPU driver's: the API group of its
# parameters (resource.nvidia.com/v1beta1) and NVIDIA's domain.
MISTAKEN_NAMES = frozenset({"resource.nvidia.com", "nvidia.com"})


def edit_distance(a: str, b: str) -> int:
    """The fewest single-character insertions, deletions, substitutions and swaps of two neighbours
    that turn `a` into `b` (optimal string alignment distance)."""
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        earlier, before, row = before, row, [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            row[j] = min(before[j] + 1, row[j - 1] + 1, before[j - 1] + (x != y))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                row[j] = min(row[j], earlier[j - 2] + 1)
    return row[-1]


def near_miss(name: str, driver: str) -> bool:
    """Whether a config's driver `name` is most likely a mistyped `driver`: not `driver` and not
    another real driver, but equal to it ignoring case, at most two typos away (one for names shorter
    than 8 characters, where two would reach unrelated names), or one of the names taken for it."""
    if name == driver or name in KNOWN_DRIVERS:
        return False
    if name in MISTAKEN_NAMES:
        return True
    return edit_distance(name.casefold(), driver.casefold()) <= (2 if len(driver) >= 8 else 1)


def near_miss_configs(claim: Mapping[str, Any], driver: str) -> tuple[str, ...]:
    """A message for each opaque config of the claim (its own, and its DeviceClasses' as the scheduler
    copied them into the allocation) whose driver is a near miss of `driver`. DRA hands each driver
    only the configs naming it, so such a config is ignored without a word; the messages say so."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    places = (
        ("spec.devices.config", ((claim.get("spec") or {}).get("devices") or {}).get("config"), None,
         "a claim's spec cannot change: create the claim again"),
        ("status.allocation.devices.config", (allocation.get("devices") or {}).get("config"), "FromClass",
         "in the DeviceClass the claim's request names"),
    )
    found = []
    for where, entries, source, fix in places:
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, Mapping) or (source is not None and entry.get("source") != source):
                continue
            opaque = entry.get("opaque")
            name = opaque.get("driver") if isinstance(opaque, Mapping) else None
            if isinstance(name, str) and near_miss(name, driver):
                found.append(
                    f"{where}[{i}].opaque.driver is {name!r}, not this driver's name {driver!r}: the config "
                    "is ignored, as DRA ignores every config of another driver, and the claim is prepared "
                    f"without it; if it was meant for {driver}, correct the driver name ({fix})")
    return tuple(found)
