"""`mps-control-daemon mount-shm`: the tmpfs that MPS clients share as /dev/shm.

MPS clients of one server exchange data through /dev/shm, so every workload container of an MPS
resource gets the same host directory (`<mpsRoot>/shm`) there. The chart's init container runs this
command, privileged and with bidirectional mount propagation, so the host sees the mount.
"""

from __future__ import annotations

import re
from pathlib import Path

FALLBACK_SIZE = "65536k"
MOUNT_OPTIONS = "rw,nosuid,nodev,noexec,relatime"
_MEMTOTAL = re.compile(r"^MemTotal:\s+(\d+)\s*(\w*)\s*$", re.MULTILINE)
# /proc/meminfo says "kB"; mount(8) size suffixes are single letters.
_UNITS = {"": "", "b": "", "kb": "k", "k": "k", "mb": "m", "m": "m", "gb": "g", "g": "g"}


def shm_size(meminfo: str | None) -> str:
    """Half the node's memory, as a tmpfs `size=` value; the fallback when meminfo is unreadable."""
    match = _MEMTOTAL.search(meminfo or "")
    if match is None:
        return FALLBACK_SIZE
    unit = _UNITS.get(match.group(2).lower())
    total = int(match.group(1))
    if unit is None or total <= 1:
        return FALLBACK_SIZE
    return f"{total // 2}{unit}"


def is_mounted(path: Path, proc_mounts: str) -> bool:
    # /proc/mounts escapes spaces as \040; our paths come from config and rarely have any.
    target = str(path).replace(" ", "\\040")
    return any(line.split()[1:2] == [target] for line in proc_mounts.splitlines())


def mount_shm_commands(shm_path: Path, size: str, mounted: bool) -> list[list[str]]:
    """The argv lists that (re)create the tmpfs at `shm_path`, in order."""
    commands = [["umount", str(shm_path)]] if mounted else []
    commands.append(["mkdir", "-p", "-m", "0755", str(shm_path)])
    commands.append(["mount", "-t", "tmpfs", "shm", str(shm_path), "-o", f"{MOUNT_OPTIONS},size={size}"])
    return commands


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
