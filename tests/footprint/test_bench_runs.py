"""The benchmark must keep running (its figures are read by people, never asserted here), and the floor it
measures nvdp against must stay a working plugin."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

# Starts processes. NVIDIA's mock NVML needs the host without the /dev/nvidia0 the end-to-end stories
# make while they run: scripts/test.sh runs this file after them, in their process.
pytestmark = pytest.mark.slow

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
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("figure"))
    assert header.split()[:5] == ["figure", "NVIDIA", "v0.20.0", "nvdp", "floor"]
    assert "nvdp/NVIDIA" in header and "nvdp/floor" in header
    for figure in bench.FIGURES:
        row = next(line for line in lines if line.startswith(figure.label))
        cells = row[len(figure.label):].split()
        nvidia, nvdp, floor = cells[0], cells[2], cells[4]  # "0.45 ms": two cells per figure
        assert nvidia != "-" and nvdp != "-", row
        assert (floor == "-") == (figure.key == "rereg"), row
    assert "load average" in result.stdout


def test_floor_plugin_registers_and_allocates_the_requested_ids() -> None:
    """The floor under nvdp's figures is a working plugin, or the floor column would measure nothing."""
    bench = _bench_module()
    with bench.plugin("mixed-4", kind=bench.FLOOR) as run:
        bench.wait_until(lambda: bool(run.kubelet.registrations), timeout=30)
        registration = run.kubelet.registrations[0]
        assert (registration["version"], registration["resource_name"]) == ("v1beta1", bench.RESOURCE)
        uuids = [gpu.uuid for gpu in run.node.inventory.gpus]
        devices = run.kubelet.wait_for_resource(bench.RESOURCE, count=4, healthy=4, timeout=30)
        assert [d["id"] for d in devices] == uuids
        assert run.kubelet.options(bench.RESOURCE)["get_preferred_allocation_available"] is True
        response = run.kubelet.allocate(bench.RESOURCE, [[uuids[2], uuids[0]], [uuids[3]]])
        assert [c["envs"] for c in response["container_responses"]] == [
            {"NVIDIA_VISIBLE_DEVICES": f"{uuids[2]},{uuids[0]}"}, {"NVIDIA_VISIBLE_DEVICES": uuids[3]}]
        assert run.kubelet.preferred(bench.RESOURCE, uuids, [uuids[3]], 2) == [uuids[3], uuids[0]]
    assert run.process.returncode == 0, run.log_path.read_text()


def test_floor_plugin_turns_a_gpu_unhealthy_on_a_critical_xid() -> None:
    bench = _bench_module()
    with bench.plugin("mixed-4", kind=bench.FLOOR) as run:
        uuids = [gpu.uuid for gpu in run.node.inventory.gpus]
        run.kubelet.wait_for_resource(bench.RESOURCE, count=4, healthy=4, timeout=30)
        bench.wait_until(lambda: bool(run.kubelet.registrations), timeout=30)
        time.sleep(0.5)  # its health thread starts after Register
        run.node.inject_xid(uuids[1], 48)
        devices = run.kubelet.wait_for_resource(bench.RESOURCE, count=4, healthy=3, timeout=15)
        assert [d["id"] for d in devices if d["health"] != "Healthy"] == [uuids[1]]
    assert run.process.returncode == 0, run.log_path.read_text()


def test_floor_plugin_advertises_replicas_for_the_time_slicing_figure() -> None:
    bench = _bench_module()
    with bench.plugin("t4", kind=bench.FLOOR, extra_env={"FLOOR_REPLICAS": "3"}) as run:
        uuid = run.node.inventory.gpus[0].uuid
        devices = run.kubelet.wait_for_resource(bench.RESOURCE, count=3, timeout=30)
        ids = [d["id"] for d in devices]
        assert ids == [f"{uuid}::{n}" for n in range(3)]
        response = run.kubelet.allocate(bench.RESOURCE, [ids[1:]])
        assert response["container_responses"][0]["envs"] == {"NVIDIA_VISIBLE_DEVICES": uuid}
        assert run.kubelet.preferred(bench.RESOURCE, ids, [], 2) == ids[:2]


@pytest.mark.slow
def test_metrics_mode_prints_what_metrics_and_probes_cost() -> None:
    result = subprocess.run([sys.executable, str(BENCH), "--metrics", "--quick"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {line.split("  ")[0]: line.split() for line in result.stdout.splitlines()}
    for label in ("Allocate p50 added by metrics", "plugin CPU per /readyz", "plugin CPU per /healthz",
                  "plugin CPU per /metrics scrape"):
        row = next(cells for name, cells in rows.items() if name.startswith(label))
        assert row[-1] in ("pass", "FAIL") and row[-2] == "ms", row
        assert -1 < float(row[-3]) < 100, row
    (hwm,) = [cells for name, cells in rows.items() if name.startswith("VmHWM")]
    plain, with_metrics = float(hwm[-5]), float(hwm[-3])
    assert 10 < plain < with_metrics < 200, hwm
