"""Helpers for the CDI tests: small driver trees, ELF libraries with a SONAME, root-only skips."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root: mknod for device nodes")
_gcc_missing = pytest.mark.skipif(
    shutil.which("gcc") is None, reason="needs gcc to build a small ELF library"
)


def needs_gcc(test: Callable[..., None]) -> Callable[..., None]:
    """A test that compiles a small ELF library: skipped without gcc, and slow (it starts gcc)."""
    marked: Callable[..., None] = pytest.mark.slow(_gcc_missing(test))
    return marked


def elf_library(path: Path, soname: str | None) -> Path:
    """A real shared object at `path`, with DT_SONAME `soname` (none when None)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / f".{path.name}.c"
    source.write_text("int nvdp_stub(void) { return 0; }\n")
    flags = [f"-Wl,-soname,{soname}"] if soname else []
    subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", *flags, "-o", str(path), str(source)],
                   check=True, capture_output=True)
    source.unlink()
    return path


def touch(path: Path, mode: int = 0o644, data: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def link(path: Path, target: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def char_device(path: Path, major: int, minor: int, mode: int = 0o666, gid: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)
    if gid:
        os.chown(path, 0, gid)
    return path
