"""`nvdp plan` and `nvdp dra slices` on a GPU node, without --node: the node's GPUs through NVML (the
stand-in here), read by the daemons' own discovery, give what the node's profile gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.nvml import PROFILES_DIR, NodeSim

from .conftest import clean_env

pytestmark = pytest.mark.slow  # runs the command in processes with the stand-in NVML


def nvdp(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "nvdp.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("profile", ["a100-sxm-8", "h100-mig-8"])
def test_on_a_gpu_node_the_previews_read_its_gpus(profile: str, tmp_path: Path, nvml_library: Path) -> None:
    node = NodeSim(profile, tmp_path / "state")
    env = {**clean_env(), **node.env, "NODE_NAME": "gpu-node-1"}
    path = PROFILES_DIR / f"{profile}.yaml"
    live = nvdp(env, "plan").splitlines()
    assert live[0].startswith("Node: gpu-node-1 through NVML (8 GPUs, driver ")
    assert live[1:] == nvdp(env, "plan", "--node", str(path)).splitlines()[1:]
    slices = json.loads(nvdp(env, "dra", "slices", "-o", "json"))
    assert slices == json.loads(nvdp(env, "dra", "slices", "--node", str(path), "--node-name", "gpu-node-1",
                                     "-o", "json"))
    table = nvdp(env, "dra", "slices").splitlines()
    assert table[0].startswith("Node: gpu-node-1 through NVML")
    assert len([line for line in table if line.startswith("gpu-")]) == len(slices[0]["spec"]["devices"])
