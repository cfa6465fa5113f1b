"""The MPS daemon's state per resource, published as `<root>/<resource>/status.json` for the plugin.

The ready marker only says "serve"; when it is absent the plugin must still tell the operator why:
no daemon on this node, a daemon that keeps failing (and its last error), or an unusable MPS root.
The daemon rewrites this file on every change and at least every REFRESH_S while it runs, so a file
older than STALE_AFTER_S was left by a daemon that is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Literal, TypeVar, cast

import msgspec
from msgspec import Struct

R = TypeVar("R")

State = Literal["starting", "ready", "failing", "stopped"]
STATES: tuple[State, ...] = ("starting", "ready", "failing", "stopped")
REFRESH_S = 10.0
# A launch attempt can take three 5 s command timeouts on top of the refresh interval.
STALE_AFTER_S = 60.0
# A status file is a few hundred bytes; anything larger is not ours.
MAX_BYTES = 64 * 1024


class DaemonStatus(Struct, frozen=True):
    state: State
    error: str | None
    updated: float  # time.time() of the last write

    def age_s(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.updated

    def is_current(self, now: float | None = None) -> bool:
        return self.state != "stopped" and self.age_s(now) <= STALE_AFTER_S


def replace_file(path: Path, body: bytes) -> None:
    """Replace a small file under the MPS root atomically (readers see the old or the new one, never
    a part); OSError when the MPS root cannot be written."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        temporary.write_bytes(body)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def read_small(path: Path, max_bytes: int) -> bytes | None:
    """A small file's bytes; None when it cannot be read or is over `max_bytes` (then it is not ours)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError:
        return None
    return raw if len(raw) <= max_bytes else None


def read_record(path: Path, kind: type[R], max_bytes: int) -> R | None:
    """The msgspec record `kind` in a small file; None when the file is missing, over `max_bytes` or not
    such a record (a half-written or foreign file is never ours to judge)."""
    raw = read_small(path, max_bytes)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def write_status(path: Path, state: State, error: str | None = None) -> None:
    """Replace the status file atomically; OSError when the MPS root cannot be written."""
    replace_file(path, (json.dumps({"state": state, "error": error, "updated": time.time()}) + "\n").encode())


def read_status(path: Path) -> DaemonStatus | None:
    """The published status, or None when there is none (or it cannot be read as one)."""
    raw = read_small(path, MAX_BYTES)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        state = data["state"]
        error = data.get("error")
        updated = float(data["updated"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if state not in STATES or not (error is None or isinstance(error, str)):
        return None
    return DaemonStatus(state=cast(State, state), error=error, updated=updated)
