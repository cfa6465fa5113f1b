"""scripts/gpu_node_check.py, the real-GPU check, run on the stand-in NVML so that it keeps working
between the times it meets a real driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # starts processes

ROOT = Path(__file__).resolve().parents[2]
T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"
UPSTREAM = Path(os.environ.get("NVDP_UPSTREAM_SHARED", ROOT.parent / "shared" / "upstream"))


def run_check(out: Path, stages: str, *more: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_node_check.py"), "--sim", "t4",
                           "--stages", stages, "--out", str(out), *more],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, Any] = json.loads((out / "gpu-node-check.json").read_text())
    return report["stages"]  # type: ignore[no-any-return]


def test_each_stage_reports_what_the_plugin_served(tmp_path: Path) -> None:
    stages = run_check(tmp_path, "inventory,recheck,events,plan,dra,gfd,plugin")
    assert [g["uuid"] for g in stages["inventory"]["gpus"]] == [T4]
    check = stages["recheck"][T4]
    assert check["check"]["answers"] and check["readings"]["remapped_rows"] == "NVMLError: Not Supported"
    assert stages["events"][T4]["xid_registration"] == "ok"
    assert [r["count"] for r in stages["plan"]["time-slicing-x4"]["resources"]] == [4]
    (device,) = stages["dra"]["slices"][0]["spec"]["devices"]
    assert device["attributes"]["uuid"] == {"string": T4}
    assert stages["gfd"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    served = stages["plugin"]
    assert [d["health"] for d in served["default"]["devices"]] == ["Healthy"]
    assert served["default"]["allocate"]["container_responses"][0]["envs"] == {"NVIDIA_VISIBLE_DEVICES": T4}
    assert len(served["time-slicing-x4"]["devices"]) == 4


def test_the_recovery_and_xid_stages_follow_the_gpu_down_and_back(tmp_path: Path) -> None:
    stages = run_check(tmp_path, "recovery,xid")
    recovering = [health for _, health in stages["recovery"]["xid-94"]["timeline"]]
    assert recovering[-2:] == ["Unhealthy", "Healthy"]
    reset = stages["recovery"]["xid-48"]
    assert reset["timeline"][-1][1] == "Unhealthy", "a fault that needs a reset is not back on time alone"
    assert "needs-reset" in reset["nvdp_health"] and reset["after_clear"][-1][1] == "Healthy"
    assert [health for _, health in stages["xid"]["timeline"]][-2:] == ["Unhealthy", "Healthy"]


def test_nvidias_plugin_beside_it_keeps_the_gpu_down_after_the_same_xid(tmp_path: Path) -> None:
    if not (UPSTREAM / "setup.sh").exists():
        pytest.skip(f"NVIDIA's plugin is not at {UPSTREAM} (NVDP_UPSTREAM_SHARED)")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("NVIDIA's plugin runs in a private mount namespace: needs root and unshare")
    env = {**os.environ, "UPSTREAM_DIR": str(ROOT / ".build" / "nvidia-upstream")}
    unpacked = subprocess.run(["bash", str(UPSTREAM / "setup.sh")], capture_output=True, text=True,
                              check=True, env=env)
    binary = Path(unpacked.stdout.strip()) / "bin" / "nvidia-device-plugin"
    xid = run_check(tmp_path, "xid", "--nvidia-plugin", str(binary))["xid"]
    assert xid["nvidia_allocate"] == xid["nvdp_allocate"]
    assert [health for _, health in xid["timeline"]][-2:] == ["Unhealthy", "Healthy"]
    nvidia = xid["nvidia_timeline"]
    assert "Unhealthy" in [health for _, health in nvidia] and nvidia[-1][1] == "Unhealthy"
    assert nvidia[-1][0] - xid["timeline"][-1][0] >= 9, "NVIDIA's was watched for 10 s after nvdp's came back"
