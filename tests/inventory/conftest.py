"""Fixtures for inventory tests: the stand-in NVML built once, and subprocesses that load it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sim.nvml import NodeSim, build_library

RunPy = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def nvml_library() -> Path:
    return build_library()


@pytest.fixture
def make_node(nvml_library: Path, tmp_path: Path) -> Callable[[str], NodeSim]:
    def make(profile: str) -> NodeSim:
        return NodeSim(profile, tmp_path / f"state-{profile}")

    return make


def python_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_") and k != "LD_LIBRARY_PATH"}
    env.update(extra)
    return env


@contextmanager
def line_process(node: NodeSim, script: str) -> Iterator[subprocess.Popen[str]]:
    """`script` in a fresh interpreter on `node`'s NVML, kept running: it prints READY, then answers one
    line per line it reads, and ends when its input closes (ending with status 0 is checked)."""
    proc = subprocess.Popen([sys.executable, "-c", script], env=python_env(node.env), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


@pytest.fixture
def run_py() -> RunPy:
    """Run Python code in a fresh interpreter (so LD_LIBRARY_PATH applies) with extra env variables."""

    def run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            env=python_env(env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return run
