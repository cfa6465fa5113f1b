"""mount-shm: tmpfs size from /proc/meminfo and the exact mount commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvdp.mps.node.shm import is_mounted, mount_shm_commands, shm_size

MEMINFO = "MemTotal:       131900756 kB\nMemFree:        100000000 kB\n"


def test_size_is_half_of_memtotal() -> None:
    assert shm_size(MEMINFO) == "65950378k"


@pytest.mark.parametrize("meminfo", [None, "", "MemFree: 12 kB\n", "MemTotal: 12 parsecs\n"])
def test_size_fallback(meminfo: str | None) -> None:
    assert shm_size(meminfo) == "65536k"


def test_commands_when_not_mounted() -> None:
    assert mount_shm_commands(Path("/mps/shm"), "65950378k", mounted=False) == [
        ["mkdir", "-p", "-m", "0755", "/mps/shm"],
        ["mount", "-t", "tmpfs", "shm", "/mps/shm", "-o", "rw,nosuid,nodev,noexec,relatime,size=65950378k"],
    ]


def test_commands_unmount_first_when_mounted() -> None:
    commands = mount_shm_commands(Path("/mps/shm"), "65536k", mounted=True)
    assert commands[0] == ["umount", "/mps/shm"]
    assert len(commands) == 3


def test_is_mounted() -> None:
    mounts = "proc /proc proc rw 0 0\nshm /mps/shm tmpfs rw,nosuid 0 0\n"
    assert is_mounted(Path("/mps/shm"), mounts)
    assert not is_mounted(Path("/mps/sh"), mounts)


@pytest.mark.slow
def test_dry_run_prints_the_commands(mps_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nvdp.mps.main", "mount-shm", "--dry-run"],
        env={"MPS_CONTAINER_ROOT": str(mps_root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    size = shm_size(Path("/proc/meminfo").read_text())
    assert done.stdout.splitlines() == [
        f"mkdir -p -m 0755 {mps_root}/shm",
        f"mount -t tmpfs shm {mps_root}/shm -o rw,nosuid,nodev,noexec,relatime,size={size}",
    ]
    assert not (mps_root / "shm").exists()
