"""`nvdp plan` end to end: shipped node profiles, config files through the loader, the `nvdp` entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvdp.cli import main

PROFILES = Path(__file__).resolve().parents[2] / "sim" / "profiles"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_ten_time_slicing_replicas_on_one_t4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(
        tmp_path,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 10\n",
    )
    assert main(["plan", "--config", cfg, "--node", str(PROFILES / "t4.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        f"Config: {cfg} (migStrategy none)",
        "",
        "RESOURCE        COUNT  DEVICES  GPUS        SHARING",
        "nvidia.com/gpu  10     1        0 Tesla T4  time-slicing x10",
    ]


def test_mps_rename_by_default_on_mixed_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(
        tmp_path,
        "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    assert main(["plan", "--config", cfg, "--node", str(PROFILES / "mixed-4.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [resource] = data["resources"]
    assert (resource["name"], resource["count"], resource["sharing"], resource["replicas"]) == (
        "nvidia.com/gpu.shared",
        16,
        "mps",
        4,
    )
    assert (resource["source_name"], resource["fail_requests_greater_than_one"]) == ("nvidia.com/gpu", True)
    assert resource["gpus"] == "0-1 Tesla T4, 2-3 Tesla V100-SXM2-16GB"


def test_mps_replicas_above_the_cap_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(
        tmp_path,
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 64\n",
    )
    assert main(["plan", "--config", cfg, "--node", str(PROFILES / "t4.yaml")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "nvdp plan: error: sharing.mps.resources[0] (nvidia.com/gpu): 64 MPS replicas on GPU 0 "
        "(Tesla T4, GPU-"
    )
    assert captured.err.endswith(
        "exceed the maximum of 48 MPS clients for a GPU of compute capability 7.5; "
        "set replicas to 48 or less\n"
    )


def test_config_error_exits_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(tmp_path, "version: v1\nflags:\n  migStrategy: sometimes\n")
    assert main(["plan", "--config", cfg, "--node", str(PROFILES / "t4.yaml")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("nvdp plan: error: ")
    assert "flags.migStrategy" in captured.err and "Traceback" not in captured.err


def test_mixed_on_the_h100_mig_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--node", str(PROFILES / "h100-mig-single.yaml"), "--mig-strategy", "mixed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[3:] == [
        "RESOURCE                COUNT  DEVICES  GPUS                       SHARING",
        "nvidia.com/mig-1g.10gb  56     56       0-7 NVIDIA H100 80GB HBM3  none",
    ]


def test_single_on_a_gpu_without_mig_devices_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--node", str(PROFILES / "h100-mig-empty.yaml"), "--mig-strategy", "single"]) == 2
    err = capsys.readouterr().err
    assert "has no MIG devices configured; create MIG devices on it" in err
    assert err.count("\n") == 1
