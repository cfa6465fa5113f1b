"""The health record on disk: `<dir>/health.json`, and the hand-made clear requests beside it.

The plugin that serves the node's GPUs writes the record after every change (write to a temporary
file, then rename: a reader never sees half of it). It reads it back when it starts, so a restart of
the plugin does not forget a GPU waiting for a reset; the chart puts the directory under /run, which
a reboot (which resets every GPU) empties. GPU feature discovery reads it for its health labels.
`nvdp health clear` leaves one file per GPU (or `all`) under `clear/`; the plugin takes them within
a second.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec import Struct

FILE = "health.json"
CLEAR_DIR = "clear"
CLEAR_ALL = "all"
VERSION = 1
NEEDS_SERVICE = frozenset({"needs-reset", "flapping", "recovery-off"})


class StateError(Exception):
    """The record cannot be read (not JSON, another version): the message says which file and why."""


class Summary(Struct, frozen=True):
    """How many GPUs are down, and how many of them will not come back by themselves."""

    unhealthy: int = 0
    needs_service: int = 0


def write_state(directory: str, writer: str, record: Mapping[str, Any], now: float) -> None:
    """Replace the record (raises OSError)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    document = {"version": VERSION, "writer": writer, "written": now, **record}
    fd, temp = tempfile.mkstemp(dir=path, prefix=".health-", suffix=".json")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide it from GPU feature discovery (another user)
        with os.fdopen(fd, "w") as out:
            json.dump(document, out, indent=1, sort_keys=True)
        os.replace(temp, path / FILE)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def read_state(directory: str) -> dict[str, Any] | None:
    """The record, or None when there is none."""
    path = Path(directory) / FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StateError(f"cannot read {path}: {err.strerror}") from None
    try:
        document = json.loads(text)
    except ValueError as err:
        raise StateError(f"{path} is not JSON ({err}); delete it to start with every GPU healthy") from None
    if not isinstance(document, dict) or document.get("version") != VERSION:
        raise StateError(f"{path} is not a version {VERSION} health record; delete it to start with every "
                         "GPU healthy")
    return document


def read_usable_state(directory: str, log: logging.Logger, unused: str) -> dict[str, Any] | None:
    """The record in `directory`, or None when there is no directory, no record or an unreadable one
    (logged as a warning after `unused`, what the reader does without it)."""
    if not directory:
        return None
    try:
        return read_state(directory)
    except StateError as err:
        log.warning("%s: %s", unused, err)
        return None


def down_gpus(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record's GPUs that are down, by UUID (empty without a record)."""
    return dict((record or {}).get("gpus") or {})


def summary(record: Mapping[str, Any] | None) -> Summary:
    states = [str(dict(entry).get("state", "")) for entry in down_gpus(record).values()
              if isinstance(entry, Mapping)]
    return Summary(unhealthy=len(states), needs_service=sum(1 for s in states if s in NEEDS_SERVICE))


def request_clear(directory: str, gpus: list[str]) -> list[Path]:
    """Ask the plugin to clear `gpus` (empty: all of them); returns the request files."""
    requests = Path(directory) / CLEAR_DIR
    requests.mkdir(parents=True, exist_ok=True)
    made = []
    for name in gpus or [CLEAR_ALL]:
        if "/" in name or name.startswith("."):
            raise ValueError(f"not a GPU UUID: {name!r} (use the UUID shown in the GPUUnhealthy Event)")
        target = requests / name
        target.touch()
        made.append(target)
    return made


def take_clear_requests(directory: str) -> list[str] | None:
    """The GPUs asked to be cleared since the last call (their files are removed); None means all."""
    requests = Path(directory) / CLEAR_DIR
    try:
        names = sorted(os.listdir(requests))
    except FileNotFoundError:
        return []
    taken = []
    for name in names:
        (requests / name).unlink(missing_ok=True)
        taken.append(name)
    return None if CLEAR_ALL in taken else taken
