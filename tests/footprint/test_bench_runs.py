"""The benchmarks must keep running (their figures are read by people, never asserted here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
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


FLOOR_SERVERS = pytest.mark.parametrize("server", ["threads", "aio"])


@FLOOR_SERVERS
def test_floor_plugin_registers_and_allocates_the_requested_ids(server: str) -> None:
    """The floor under nvdp's figures is a working plugin, or the floor column would measure nothing."""
    bench = _bench_module()
    with bench.plugin("mixed-4", kind=bench.FLOOR, extra_env={"FLOOR_SERVER": server}) as run:
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
        assert f"floor plugin: gRPC server: {server}\n" in run.log_path.read_text()
    assert run.process.returncode == 0, run.log_path.read_text()


@FLOOR_SERVERS
def test_floor_plugin_turns_a_gpu_unhealthy_on_a_critical_xid(server: str) -> None:
    bench = _bench_module()
    with bench.plugin("mixed-4", kind=bench.FLOOR, extra_env={"FLOOR_SERVER": server}) as run:
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
def test_xid_stages_prints_every_stage_for_both_plugins() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "xid_stages.py"), "--rounds", "1",
                             "--events", "2"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "events with every stamp: nvdp 2, floor 2" in result.stdout, result.stdout
    lines = result.stdout.splitlines()
    total = next(line for line in lines if line.startswith("XID written -> Unhealthy seen"))
    nvdp, floor = (float(cell) for cell in total.split()[-3:-1])
    assert 0 < nvdp < 1000 and 0 < floor < 1000, total


@pytest.mark.slow
def test_floor_servers_compares_both_servers() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "floor_servers.py"), "--rounds", "1",
                             "--calls", "50"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    rows = {line[:22].strip(): line[22:].split() for line in result.stdout.splitlines()}
    for figure in ("spawn -> registered", "VmHWM after 5 s", "Allocate p50", "XID -> Unhealthy"):
        threads, _unit, aio, _unit2, ratio = rows[figure]
        assert float(threads) > 0 and float(aio) > 0 and float(ratio) > 0, rows[figure]


@pytest.mark.slow
def test_start_up_phases_add_up_to_the_registration() -> None:
    """Every stage of the start-up profile is stamped; the stages in order make up spawn -> registered."""
    upstream = _bench_module().UPSTREAM_DIR
    if not (upstream / "setup.sh").is_file():
        pytest.skip(f"{upstream} (NVIDIA's mock NVML, which the phases run on) is not there")
    command = [sys.executable, str(ROOT / "bench" / "profile_plugin.py"), "phases", "--starts", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    figures = {line[:34].strip(): float(line[34:].split()[0])
               for line in result.stdout.splitlines() if line.startswith("  ")}
    assert len(figures) == 9 and all(value > 0 for value in figures.values()), result.stdout
    stages = ("spawn -> interpreter ready", "import nvdp.plugin.main", "arguments, logging, signals",
              "load config", "NVML: pynvml, init, GPUs", "plan (imports grpc, API)",
              "servers up -> registered")
    # The stages leave out only the few steps between them (logging a line, entering a method); each
    # figure is rounded to 0.1 ms, so their sum may pass the total by up to 0.05 ms a stage.
    total = figures["spawn -> registered"]
    assert 0.9 * total <= sum(figures[stage] for stage in stages) <= total + 0.05 * len(stages), result.stdout


@pytest.mark.slow
def test_grpc_floor_runs_every_server_and_the_one_given_options() -> None:
    command = [sys.executable, str(ROOT / "bench" / "grpc_floor.py"), "--rounds", "1", "--calls", "20",
               "--option", "grpc.minimal_stack=1", "--option", "grpc.http2.bdp_probe=0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "threads+options: grpc.minimal_stack=1, grpc.http2.bdp_probe=0" in result.stdout, result.stdout
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if " ms " in line}
    assert sorted(rows) == ["aio", "threads", "threads+options", "threads+stream"], result.stdout
    for p50, _unit, p99, _unit2 in rows.values():
        assert 0 < float(p50) <= float(p99), result.stdout


def test_grpc_floor_refuses_an_option_without_a_value() -> None:
    command = [sys.executable, str(ROOT / "bench" / "grpc_floor.py"), "--option", "grpc.minimal_stack"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "'grpc.minimal_stack': expected NAME=VALUE" in result.stderr


@pytest.mark.slow
def test_allocate_line_runs_every_variant() -> None:
    command = [sys.executable, str(ROOT / "bench" / "allocate_line.py"), "--rounds", "1", "--calls", "20"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {line[:20].strip(): line[20:].split() for line in result.stdout.splitlines() if " ms " in line}
    assert list(rows) == ["line written", "no line", "record + format", "message only", "fixed os.write",
                          "line to /dev/null", "line to a pipe", "floor"], result.stdout
    for p50, _unit, p99, _unit2, ratio, _round in rows.values():
        assert 0 < float(p50) <= float(p99) and float(ratio) > 0, result.stdout
    assert rows["floor"][4] == "1.00"


def test_bench_plugin_refuses_an_unknown_log_destination() -> None:
    bench = _bench_module()
    with pytest.raises(ValueError, match="log_via 'socket': expected file, pipe or devnull"), \
            bench.plugin("t4", log_via="socket"):
        pass
