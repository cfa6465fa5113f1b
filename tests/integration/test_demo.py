"""README's main command: the real plugin on a simulated node, as the kubelet sees it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_default_demo_shows_registration_count_and_allocate() -> None:
    result = run_demo()
    assert result.returncode == 0, result.stderr
    assert '"resource_name": "nvidia.com/gpu"' in result.stdout
    assert "nvidia.com/gpu: 1 allocatable (1 healthy)" in result.stdout
    assert '"NVIDIA_VISIBLE_DEVICES": "GPU-' in result.stdout
    assert "Plugin stopped cleanly" in result.stdout


def test_seed_004_demo_runs_the_mps_daemon_and_advertises_ten() -> None:
    result = run_demo("--config", str(ROOT / "tests" / "config" / "valid" / "seed-004-mps.yaml"))
    assert result.returncode == 0, result.stderr
    assert "nvidia.com/gpu: 10 allocatable (10 healthy)" in result.stdout
    assert '"CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe"' in result.stdout


def test_bad_config_fails_with_every_problem_and_no_traceback(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  renameByDefault: true\n")
    result = run_demo("--config", str(config))
    assert result.returncode == 1
    assert "did you mean sharing.timeSlicing.renameByDefault?" in result.stderr
    assert "Traceback" not in result.stderr
