"""The benchmarks must keep running (their figures are read by people, never asserted here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "plugin_bench.py"


def _bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plugin_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_side_by_side_says_why_it_skips_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench_module()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = bench.why_nvidia_cannot_run()
    assert reason is not None and "root" in reason and "mount namespace" in reason


@pytest.mark.slow
def test_side_by_side_prints_both_plugins_or_the_reason() -> None:
    result = subprocess.run([sys.executable, str(BENCH), "--against-nvidia", "--quick"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    bench = _bench_module()
    reason = bench.why_nvidia_cannot_run()
    if reason is not None:
        assert f"skipped --against-nvidia: {reason}" in result.stdout
        pytest.skip(f"side-by-side mode cannot run here: {reason}")
    header = next(line for line in result.stdout.splitlines() if line.startswith("figure"))
    assert "NVIDIA v0.20.0" in header and "nvdp/NVIDIA" in header
    for figure in bench.FIGURES:
        assert figure.label in result.stdout
    assert "load average" in result.stdout
