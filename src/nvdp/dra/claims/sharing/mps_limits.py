"""The limits of DRA claims that share an MPS daemon, and the one ceiling that daemon runs with.

MPS enforces one thread and pinned-memory ceiling per server, for every client of it; a client's own
`CUDA_MPS_*` variables can only lower it (measured on an H100; see docs/dra.md). All MPS claims on a
GPU set share its daemon, so the rule is: the daemon's ceiling is the largest limit among its claims,
per field and per GPU (a claim without a limit makes it the whole GPU). No claim is cut below what it
was given and none can go above the largest; each claim's environment lowers it to its own limit.
Where every claim asks the same, the ceiling is each claim's limit and is enforced; where they differ,
the part of a smaller claim's limit below the ceiling is advisory (its containers' environment).

Pure, apart from the limits file (`limits.json` beside the daemon's status file) that the plugin writes
for `nvdp doctor`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec
from msgspec import Struct

from nvdp.dra.claims.records import ClaimLimits as ClaimLimits
from nvdp.mps.commands import Ceiling
from nvdp.mps.status import read_small, replace_file

LIMITS_FILE = "limits.json"
MAX_BYTES = 256 * 1024


def daemon_ceiling(gpus: Sequence[str], claims: Iterable[ClaimLimits]) -> Ceiling:
    """The largest of the claims' limits, per field and per GPU (`gpus` in the daemon's order)."""
    listed = list(claims)
    threads = max((c.thread_percentage or 100 for c in listed), default=100)
    memory: list[int | None] = []
    for gpu in gpus:
        limits = [c.memory_of(gpu) for c in listed]
        memory.append(None if not limits or None in limits else max(x for x in limits if x is not None))
    return Ceiling(thread_percentage=threads, memory_mib=tuple(memory))


class Enforcement(Struct, frozen=True):
    """How much of one claim's limits the daemon's ceiling enforces."""

    enforced: bool  # its limits are the ceiling: MPS holds its clients to them
    advisory: tuple[str, ...]  # the limits only its environment keeps, each with the ceiling above it


def enforcement(limits: ClaimLimits, gpus: Sequence[str], ceiling: Ceiling) -> Enforcement:
    advisory = []
    threads = limits.thread_percentage or 100
    if threads < ceiling.thread_percentage:
        advisory.append(f"{threads}% threads (enforced: {ceiling.thread_percentage}%)")
    for gpu, top in zip(gpus, ceiling.memory_mib, strict=True):
        mine = limits.memory_of(gpu)
        if mine is not None and (top is None or mine < top):
            advisory.append(f"{mine} MiB on {gpu} (enforced: {f'{top} MiB' if top is not None else 'none'})")
    return Enforcement(enforced=not advisory, advisory=tuple(advisory))


def describe_ceiling(gpus: Sequence[str], ceiling: Ceiling) -> str:
    memory = ", ".join(f"{mib} MiB on {gpu}" if mib is not None else f"no memory limit on {gpu}"
                       for gpu, mib in zip(gpus, ceiling.memory_mib, strict=True))
    return f"{ceiling.thread_percentage}% threads, {memory}"


# --- the limits file, for nvdp doctor -------------------------------------------------------------------


class DaemonLimits(Struct, frozen=True):
    """What `limits.json` holds: the daemon's GPUs, its ceiling, and each claim's limits by claim UID."""

    gpus: tuple[str, ...]
    ceiling: Ceiling
    claims: dict[str, ClaimLimits]


def write_limits(path: Path, gpus: Sequence[str], ceiling: Ceiling,
                 claims: Mapping[str, ClaimLimits]) -> None:
    """Replace the file atomically; OSError when the MPS root cannot be written."""
    replace_file(path, msgspec.json.encode(DaemonLimits(gpus=tuple(gpus), ceiling=ceiling,
                                                       claims=dict(claims))) + b"\n")


def read_limits(path: Path) -> DaemonLimits | None:
    """The file's limits; None when there is none or it is not one (a half-written or foreign file)."""
    raw = read_small(path, MAX_BYTES)
    if raw is None:
        return None
    try:
        found = msgspec.json.decode(raw, type=DaemonLimits)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return found if len(found.ceiling.memory_mib) == len(found.gpus) else None
