"""Fixtures for MPS tests: the stand-in nvidia-cuda-mps-control on PATH, short temp roots, T4 nodes."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.mps import BIN_DIR, RECORD_ENV


@pytest.fixture
def mps_root() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path is often too deep for one.
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def record(mps_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in on PATH, recording into a file the test reads."""
    path = mps_root / "record.jsonl"
    monkeypatch.setenv("PATH", f"{BIN_DIR}:{os.environ['PATH']}")
    monkeypatch.setenv(RECORD_ENV, str(path))
    return path
