"""Finding libnvidia-ml.so.1 under the container driver root, with host symlinks resolved inside it."""

from __future__ import annotations

from pathlib import Path

from nvdp.inventory.library import candidate_paths, find_library, resolve_in_root


def test_nothing_under_an_empty_root(tmp_path: Path) -> None:
    assert find_library(tmp_path) is None
    assert candidate_paths("/driver-root")[0] == Path("/driver-root/usr/lib64/libnvidia-ml.so.1")
    assert len(candidate_paths(tmp_path)) == 6


def test_search_order_and_relative_link(tmp_path: Path) -> None:
    late = tmp_path / "lib/x86_64-linux-gnu"
    late.mkdir(parents=True)
    (late / "libnvidia-ml.so.1").write_bytes(b"late")
    assert find_library(tmp_path) == late / "libnvidia-ml.so.1"
    early = tmp_path / "usr/lib64"
    early.mkdir(parents=True)
    (early / "libnvidia-ml.so.550.54.15").write_bytes(b"real")
    (early / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.54.15")
    assert find_library(tmp_path) == early / "libnvidia-ml.so.550.54.15"


def test_absolute_link_resolves_inside_the_root(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/aarch64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.550.54.15").write_bytes(b"real")
    (lib / "libnvidia-ml.so.1").symlink_to("/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.550.54.15")
    assert find_library(tmp_path) == lib / "libnvidia-ml.so.550.54.15"


def test_dangling_and_looping_links_are_skipped(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.1").symlink_to("/nowhere/libnvidia-ml.so.1")
    loop = tmp_path / "lib64"
    loop.mkdir()
    (loop / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.1")
    assert resolve_in_root(tmp_path, lib / "libnvidia-ml.so.1") is None
    assert resolve_in_root(tmp_path, loop / "libnvidia-ml.so.1") is None
    assert find_library(tmp_path) is None
