"""README's main command: nvdp's real daemons on a simulated node, and what the demo says about them.

The device-plugin demo shows a header (what it started, real or simulated), every resource of the plan in
the plan's order (the same on every run), one Allocate answer each, the plugin's log and next steps. A
config in DRA mode runs the DRA demo (a throwaway kube-apiserver, the slices, one claim prepared), or is
refused at once, naming the demo's own flag, where the machine lacks what that needs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kube.envtest import unavailable_reason

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]
MPS_CONFIG = ROOT / "tests" / "config" / "valid" / "seed-004-mps.yaml"
DRA_CONFIG = ROOT / "tests" / "config" / "valid" / "mode-dra.yaml"


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def section(output: str, title: str) -> str:
    """The lines of one `== title` section."""
    start = output.index(f"== {title}")
    end = output.find("\n== ", start + 1)
    return output[start:] if end < 0 else output[start:end]


def test_default_demo_says_what_it_started_and_what_comes_next() -> None:
    result = run_demo()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("nvdp demo: the device plugin on a simulated node\n")
    assert "started: nvidia-device-plugin (python -m nvdp.plugin.main): the real plugin process" in out
    assert "kubelet: simulated" in out and "through the stand-in NVML" in out
    assert "config:  the built-in defaults (no --config)" in out
    assert "nvidia.com/gpu: 1 allocatable (1 healthy)" in out
    assert "env NVIDIA_VISIBLE_DEVICES=GPU-" in out
    assert "Stopped: the plugin exited 0 after SIGTERM." in out
    steps = section(out, "Next steps")
    for step in ("--profile", "--config", "--dra", "nvdp plan --node t4", "docs/kind.md"):
        assert step in steps
    # The plugin's own log agrees with the header: no config file, the built-in defaults.
    log = section(out, "The plugin's log")
    assert "Config in force: the built-in defaults (no config file)" in log
    assert "the config file" not in log
    assert "Traceback" not in result.stderr


def test_seed_004_demo_runs_the_mps_daemon_and_advertises_ten() -> None:
    result = run_demo("--config", str(MPS_CONFIG))
    assert result.returncode == 0, result.stderr
    assert "mps-control-daemon (python -m nvdp.mps.main): the real MPS control daemon" in result.stdout
    assert "nvidia.com/gpu: 10 allocatable (10 healthy)" in result.stdout
    assert "env CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe" in result.stdout
    assert f"Config in force: the config file {MPS_CONFIG}" in section(result.stdout, "The plugin's log")


def test_every_resource_of_the_plan_in_the_plans_order_on_every_run(tmp_path: Path) -> None:
    """Seven MIG resources register in whatever order their servers come up; the demo shows them all,
    in the plan's order, so two runs print the same."""
    config = tmp_path / "mixed.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    seen = []
    for _ in range(2):
        result = run_demo("--profile", "h100-mig-8", "--config", str(config))
        assert result.returncode == 0, result.stderr
        plan = section(result.stdout, "The plan")
        planned = re.findall(r"^  (nvidia\.com/\S+)", plan, re.MULTILINE)
        kubelet = section(result.stdout, "What the kubelet sees")
        shown = re.findall(r"^  (nvidia\.com/\S+): \d+ allocatable", kubelet, re.MULTILINE)
        assert len(planned) == 7 and shown == planned, kubelet
        assert kubelet.count("Allocate MIG-") == 7
        seen.append(kubelet)
    assert seen[0] == seen[1]


def test_bad_config_fails_with_every_problem_and_no_traceback(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  renameByDefault: true\n")
    result = run_demo("--config", str(config))
    assert result.returncode == 1
    assert "did you mean sharing.timeSlicing.renameByDefault?" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_dra_config_without_the_dra_demos_needs_is_refused_at_once(tmp_path: Path) -> None:
    result = run_demo("--config", str(DRA_CONFIG), "--kube-assets", str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""  # nothing started, nothing waited for
    assert f"{DRA_CONFIG} sets flags.mode: dra" in result.stderr
    assert f"kube-apiserver in {tmp_path}" in result.stderr and "--kube-assets DIR" in result.stderr
    assert f"nvdp dra slices --node t4 --config {DRA_CONFIG}" in result.stderr
    assert "dra.enabled" not in result.stderr and "Traceback" not in result.stderr


def test_contradicting_arguments_are_refused_with_the_demos_flag(tmp_path: Path) -> None:
    dynamic = tmp_path / "dynamic.yaml"
    dynamic.write_text("version: v1\nflags:\n  migStrategy: dynamic\n")
    result = run_demo("--profile", "a100-80gb-mig-dynamic", "--config", str(dynamic))
    assert result.returncode == 2 and result.stdout == ""
    assert "add --dra (the demo's DRA mode)" in result.stderr
    device_plugin = tmp_path / "device-plugin.yaml"
    device_plugin.write_text("version: v1\nflags:\n  mode: device-plugin\n")
    result = run_demo("--dra", "--config", str(device_plugin))
    assert result.returncode == 2 and "drop --dra" in result.stderr


def test_a_dra_config_runs_the_dra_demo() -> None:
    reason = unavailable_reason()
    if reason is not None:
        print(f"skipped: the DRA demo needs a throwaway kube-apiserver: {reason}")
        pytest.skip(reason)
    result = run_demo("--config", str(DRA_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith("nvdp demo (DRA): the DRA kubelet plugin on a simulated node\n")
    assert "nvidia-dra-plugin (python -m nvdp.dra.main): the real DRA plugin process" in out
    assert "scheduler: simulated" in out
    assert "DRAPlugin gpu.nvidia.com on " in section(out, "Registration")
    slices = section(out, "ResourceSlices of node demo-t4")
    row = r"^  gpu-0 +gpu +- +Tesla T4 +15\.0 GiB +nvidia\.com/gpu +0$"  # ... NUMA node 0
    assert re.search(row, slices, re.MULTILINE), slices
    claim = section(out, "ResourceClaim default/demo-gpu")
    assert "CDI devices k8s.gpu.nvidia.com/claim=" in claim
    spec = section(out, "The claim's CDI spec")
    assert '"path": "/dev/nvidia0"' in spec and "libcuda.so" in spec
    assert "the claim's CDI spec is removed" in spec
    log = section(out, "The DRA plugin's log")
    assert "Prepared claim default/demo-gpu" in log
    assert f"Config in force: the config file {DRA_CONFIG}" in log
    assert "Stopped: the DRA plugin exited 0 after SIGTERM" in out
    assert "nvdp dra slices --node t4" in section(out, "Next steps")
