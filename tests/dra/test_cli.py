"""`nvdp dra slices`: JSON ResourceSlices for a node profile; bad input is one line and exit status 2."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import kubernetes_validate
import pytest

from nvdp.dra import cli
from sim.nvml import PROFILES_DIR


def run(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="nvdp")
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["dra", "slices", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_prints_the_slices_of_a_profile() -> None:
    code, out, err = run("--node", "h100-mig-8", "--node-name", "gpu-node-1")
    assert code == 0 and err == ""
    (obj,) = json.loads(out)
    assert obj["metadata"]["name"] == "gpu-node-1-gpu.nvidia.com-0"
    assert obj["spec"]["nodeName"] == "gpu-node-1" and obj["spec"]["pool"]["name"] == "gpu-node-1"
    assert obj["spec"]["devices"][0]["name"] == "gpu-0-mig-1g10gb-19-0"
    kubernetes_validate.validate(obj, "1.36", strict=True)


def test_defaults_node_name_from_profile_and_takes_a_driver_and_a_path() -> None:
    code, out, _ = run("--node", str(PROFILES_DIR / "t4.yaml"), "--driver", "gpu.example.com")
    assert code == 0
    (obj,) = json.loads(out)
    assert obj["metadata"]["name"] == "t4-gpu.example.com-0"
    assert obj["spec"]["driver"] == "gpu.example.com"


def test_a_valid_config_is_accepted(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    code, _, err = run("--node", "t4", "--config", str(config))
    assert code == 0, err


@pytest.mark.parametrize(
    ("argv", "cause"),
    [
        (["--node", "no-such-profile"], "--node: no node profile 'no-such-profile'"),
        (["--node", "t4", "--driver", "d" * 27], "--driver: the DRA driver name"),
        (["--node", "t4", "--driver", "Bad_Driver"], "not a lower-case DNS subdomain"),
        (["--node", "t4", "--node-name", "Node_1"], "--node-name: 'Node_1' is not a node name"),
        (["--node", "t4", "--config", "/no/such/config.yaml"], "--config: /no/such/config.yaml"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], cause: str) -> None:
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("nvdp dra slices: error: ")
    assert cause in err
    assert "Traceback" not in err


def test_bad_config_and_bad_profile_files(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sideways\n")
    code, _, err = run("--node", "t4", "--config", str(config))
    assert code == 2 and "migStrategy" in err and err.count("\n") == 1
    profile = tmp_path / "bad.yaml"
    profile.write_text("driver_version: '1'\ncuda_driver_version: '12.4'\ngpus: 3\n")
    code, _, err = run("--node", str(profile))
    assert code == 2 and "gpus: expected a list" in err and err.count("\n") == 1
