"""SONAMEs read from ELF files, as Go's debug/elf reads them for NVIDIA's toolkit."""

from __future__ import annotations

from pathlib import Path

from nvdp.cdi.elf import read_soname
from tests.cdi.trees import elf_library, needs_gcc, touch


@needs_gcc
def test_the_soname_of_a_library(tmp_path: Path) -> None:
    lib = elf_library(tmp_path / "libcuda.so.550.54.15", "libcuda.so.1")
    assert read_soname(str(lib)) == "libcuda.so.1"


@needs_gcc
def test_a_library_without_soname_is_named_by_its_file(tmp_path: Path) -> None:
    lib = elf_library(tmp_path / "libnvidia-tls.so.550.54.15", None)
    assert read_soname(str(lib)) == "libnvidia-tls.so.550.54.15"


@needs_gcc
def test_a_truncated_library_has_none(tmp_path: Path) -> None:
    whole = elf_library(tmp_path / "libx.so.1", "libx.so.1").read_bytes()
    for size in (0, 3, 16, 64, len(whole) // 2):
        cut = touch(tmp_path / f"cut-{size}", data=whole[:size])
        assert read_soname(str(cut)) is None, size


def test_files_that_are_not_elf_have_none(tmp_path: Path) -> None:
    assert read_soname(str(touch(tmp_path / "empty.so.1"))) is None
    assert read_soname(str(touch(tmp_path / "script", data=b"#!/bin/sh\necho\n" * 10))) is None
    assert read_soname(str(tmp_path / "missing")) is None
    assert read_soname(str(tmp_path)) is None  # a folder
