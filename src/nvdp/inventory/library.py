"""Where libnvidia-ml.so.1 is: under the container driver root first, then the loader's default search.

The host's driver root is mounted into the plugin's container (at /driver-root by default) when the
driver is not installed in the container image itself; NVIDIA's plugin looks there first, and so do we.
"""

from __future__ import annotations

from pathlib import Path

LIBRARY_NAME = "libnvidia-ml.so.1"
SEARCH_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
)
MAX_SYMLINKS = 40


def candidate_paths(root: str | Path) -> list[Path]:
    """Every place looked at under `root`, in order (also used to explain a miss)."""
    base = Path(root)
    return [base / d / LIBRARY_NAME for d in SEARCH_DIRS]


def find_library(root: str | Path) -> Path | None:
    """The real file behind the first libnvidia-ml.so.1 under `root`, symlinks resolved inside `root`."""
    base = Path(root)
    for candidate in candidate_paths(base):
        resolved = resolve_in_root(base, candidate)
        if resolved is not None and resolved.is_file():
            return resolved
    return None


def resolve_in_root(root: Path, path: Path) -> Path | None:
    """Follow symlinks the way they resolve on the host: an absolute target is taken relative to `root`.

    The host's /usr/lib64/libnvidia-ml.so.1 -> /usr/lib64/libnvidia-ml.so.550.54.15 must resolve to
    <root>/usr/lib64/libnvidia-ml.so.550.54.15 inside the container, not to the container's own /usr.
    """
    current = path
    for _ in range(MAX_SYMLINKS):
        if not current.is_symlink():
            return current if current.exists() else None
        target = Path(current.readlink())
        if target.is_absolute():
            current = root / target.relative_to(target.anchor)
        else:
            current = current.parent / target
    return None
