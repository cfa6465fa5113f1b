"""Fixtures for the gRPC layer's tests: short socket directories and a running kubelet simulator."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under ~100 bytes."""
    with tempfile.TemporaryDirectory(prefix="nvdp-") as tmp:
        yield Path(tmp)


@pytest.fixture
def kubelet(short_tmp: Path) -> Iterator[KubeletSim]:
    with KubeletSim(short_tmp) as sim:
        yield sim
