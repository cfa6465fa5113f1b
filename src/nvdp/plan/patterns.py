"""Resource name patterns: NVIDIA's wildcard matching and its default resource names per MIG strategy."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from nvdp.config.model import RESOURCE_PREFIX, MigStrategy, ResourcePattern

GPU_RESOURCE = f"{RESOURCE_PREFIX}gpu"

# A profile whose compute instance covers only part of its GPU instance ("1c.2g.20gb") gets no
# default resource in NVIDIA's mixed strategy: only profiles with as many compute slices as GPU
# slices ("2g.20gb") are named.
_PARTIAL_COMPUTE_PROFILE = re.compile(r"^\d+c\.")


@lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    # `*` is the only wildcard and the match covers the whole name, so "1g.10gb" does not
    # match "1g.10gb+me" (NVIDIA fixed exactly that substring bug, issue #1807).
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def matches(pattern: str, name: str) -> bool:
    return _compile(pattern).fullmatch(name) is not None


def first_match(patterns: Iterable[ResourcePattern], name: str) -> ResourcePattern | None:
    return next((p for p in patterns if matches(p.pattern, name)), None)


def mig_resource_name(profile: str) -> str:
    """`1g.10gb+me` -> `nvidia.com/mig-1g.10gb.me`: `+` is not allowed in a resource name."""
    return f"{RESOURCE_PREFIX}mig-{profile.replace('+', '.')}"


def default_gpu_patterns() -> tuple[ResourcePattern, ...]:
    return (ResourcePattern("*", GPU_RESOURCE),)


def default_mig_patterns(strategy: MigStrategy, profiles: Iterable[str]) -> tuple[ResourcePattern, ...]:
    if strategy == "single":
        return (ResourcePattern("*", GPU_RESOURCE),)
    if strategy in ("mixed", "dynamic"):
        return tuple(
            ResourcePattern(p, mig_resource_name(p))
            for p in sorted(set(profiles))
            if not _PARTIAL_COMPUTE_PROFILE.match(p)
        )
    return ()


def describe(patterns: Iterable[ResourcePattern]) -> str:
    listed = ", ".join(f"'{p.pattern}' -> {p.name}" for p in patterns)
    return listed or "none"
