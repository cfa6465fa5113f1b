"""GPU feature discovery on a node in DRA mode (nvdp.daemon.pernode.mode): the labels come from the same plan
as in
device-plugin mode, so the sharing strategy, the replicas, the shared product name and
`mps.capable` say what the node's config shares, whichever API serves it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.nvml import NodeSim, build_library

N = "nvidia.com/"
MPS_10 = "version: v1\nsharing:\n  mps:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 10}\n"
# Settings the processes must not inherit from the test's environment.
NOT_INHERITED = ("LD_LIBRARY_PATH", "CONFIG_FILE", "MIG_STRATEGY", "NODE_NAME", "DRA_DRIVER_NAME",
                 "NVDP_DEFAULT_MODE")
TIME_SLICING_4 = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                  "      - {name: nvidia.com/gpu, replicas: 4}\n")
SHARING = tuple(N + key for key in ("gpu.sharing-strategy", "gpu.replicas", "gpu.product", "mps.capable",
                                    "gpu.count"))
DRA_BESIDE = {"DRA_DRIVER_NAME": "gpu.nvidia.com", "NVDP_DEFAULT_MODE": "device-plugin"}


@pytest.fixture(scope="module")
def nvml() -> Path:
    return build_library()


def gfd_env(node: NodeSim, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NVML_SIM_", "GFD_")) and k not in NOT_INHERITED}
    return {**env, **node.env, **extra}


def run_gfd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvdp.gfd.main", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def labels(node: NodeSim, config: Path, extra: dict[str, str]) -> dict[str, str]:
    env = gfd_env(node, {"CONFIG_FILE": str(config), **extra})
    result = run_gfd(env, "--oneshot", "--no-timestamp", "--use-node-feature-api=false", "-o", "")
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize(("text", "expected"), [
    (MPS_10, ("mps", "10", "Tesla-T4-SHARED", "true", "1")),
    (TIME_SLICING_4, ("time-slicing", "4", "Tesla-T4-SHARED", "false", "1")),
    ("version: v1\n", ("none", "1", "Tesla-T4", "false", "1")),
], ids=["mps", "time-slicing", "plain"])
def test_dra_mode_labels_as_device_plugin_mode(nvml: Path, tmp_path: Path, text: str,
                                               expected: tuple[str, ...]) -> None:
    dp, dra, by_default = tmp_path / "dp.yaml", tmp_path / "dra.yaml", tmp_path / "default.yaml"
    dp.write_text(text + "flags:\n  mode: device-plugin\n")
    dra.write_text(text + "flags:\n  mode: dra\n")
    by_default.write_text(text)
    with NodeSim("t4", tmp_path / "state") as node:
        in_dp = labels(node, dp, DRA_BESIDE)
        in_dra = labels(node, dra, DRA_BESIDE)
        dra_by_default = labels(node, by_default, {**DRA_BESIDE, "NVDP_DEFAULT_MODE": "dra"})
    assert tuple(in_dra[key] for key in SHARING) == expected
    assert in_dra == in_dp == dra_by_default


@pytest.mark.slow
def test_dra_mode_without_a_dra_plugin_is_refused(nvml: Path, tmp_path: Path) -> None:
    config = tmp_path / "dra.yaml"
    config.write_text("version: v1\nflags:\n  mode: dra\n")
    with NodeSim("t4", tmp_path / "state") as node:
        env = gfd_env(node, {"CONFIG_FILE": str(config)})
        result = run_gfd(env, "--oneshot", "--use-node-feature-api=false", "-o", "")
    assert result.returncode == 1
    assert "flags.mode is dra, but no DRA plugin runs beside this daemon" in result.stderr
    assert "Traceback" not in result.stderr
