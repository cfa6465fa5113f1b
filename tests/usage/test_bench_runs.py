"""bench/usage_bench.py keeps running and keeps measuring real usage series (its figures are read by
people, never asserted here; that each pod's memory is right, the bench checks itself)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes

BENCH = Path(__file__).resolve().parents[2] / "bench" / "usage_bench.py"


def test_the_usage_bench_scrapes_every_mode() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--gpus", "2", "--pods", "3", "--scrapes", "3"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["mode"]: row for row in json.loads(done.stdout.splitlines()[-1])["rows"]}
    assert list(rows) == ["off", "device-plugin", "dra", "idle"]
    # Memory and utilization for each of the 6 pods, and one count of processes of no pod per GPU.
    assert rows["device-plugin"]["usage_series"] == rows["dra"]["usage_series"] == 2 * 6 + 2
    assert rows["off"]["usage_series"] == rows["idle"]["usage_series"] == 0
    assert "| device-plugin | 14 |" in done.stdout
