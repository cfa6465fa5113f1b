"""The config entries of a mounted ConfigMap directory, and a fingerprint to notice edits.

The kubelet writes a ConfigMap volume as `..<timestamp>/` data, a `..data` symlink to it and one
symlink per key; an update swaps `..data` atomically. Names starting with `..` and directories are
not entries (as in NVIDIA's config-manager).
"""

from __future__ import annotations

from pathlib import Path

MAX_ENTRY_BYTES = 1 << 20


def list_entries(directory: str | Path) -> tuple[str, ...]:
    """Sorted entry names; raises OSError when the directory cannot be read."""
    root = Path(directory)
    return tuple(sorted(p.name for p in root.iterdir() if not p.name.startswith("..") and p.is_file()))


def entry_path(directory: str | Path, entry: str) -> Path:
    return Path(directory) / entry


def fingerprint(path: str | Path | None) -> str:
    """sha256 of a file's bytes ('' for no file, 'unreadable: ...' when it cannot be read)."""
    if path is None:
        return ""
    import hashlib  # only with a config directory: hashlib loads libcrypto (~3 MiB) into the process

    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(MAX_ENTRY_BYTES + 1)).hexdigest()
    except OSError as err:
        return f"unreadable: {err.strerror or err}"


def directory_fingerprint(directory: str | Path) -> str:
    """Changes when an entry is added, removed or edited (the `..data` swap, or plain file edits)."""
    import hashlib

    root = Path(directory)
    try:
        parts = [f"{name}={fingerprint(root / name)}" for name in list_entries(root)]
    except OSError as err:
        return f"unreadable: {err.strerror or err}"
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
