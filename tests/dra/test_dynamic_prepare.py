"""migStrategy dynamic against the stand-in NVML's MIG rules: prepare makes the claim's MIG device at
its placement, unprepare destroys it, a restart keeps it, a reboot's loss is made good, NVML's refusals
(an overlap, someone else's MIG device) fail the prepare with the cause and leave nothing half-made, and
the whole GPU and MIG devices take turns through the MIG mode (tests/dra/dynamic_scenario.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from sim.nvml import REPO_ROOT, NodeSim

pytestmark = pytest.mark.slow  # the scenario runs in a process of its own, on the stand-in's NVML


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("dynamic")
    with NodeSim("h100-mig-dynamic", base / "state") as node:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
        env.update(node.env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])
        (base / "work").mkdir()
        done = subprocess.run([sys.executable, "-m", "tests.dra.dynamic_scenario", str(node.state_dir),
                               str(base / "work")], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_three_claims_get_their_mig_devices_at_their_placements(seen: dict[str, Any]) -> None:
    assert seen["published"] == 26  # 25 placements and the whole GPU
    assert seen["errors"] == {"u-big": "", "u-mid": "", "u-small": ""}
    assert seen["live_after_three"] == ["1g.10gb@6", "2g.20gb@4", "3g.40gb@0"]
    made = seen["made"]
    assert set(made) == {"u-big", "u-mid", "u-small"}
    assert made["u-big"]["gpu-0-mig-3g40gb-9-0"].startswith("MIG-")
    # recorded in the checkpoint, and in each claim's status for monitoring
    assert seen["checkpoint_instances"]["u-big"] == [made["u-big"]["gpu-0-mig-3g40gb-9-0"]]
    entries = [e for status in seen["statuses"] for e in status]
    assert {(e["device"], e["data"]["profile"]) for e in entries} == {
        ("gpu-0-mig-3g40gb-9-0", "3g.40gb"), ("gpu-0-mig-2g20gb-14-4", "2g.20gb"),
        ("gpu-0-mig-1g10gb-19-6", "1g.10gb")}
    assert all(e["driver"] == "gpu.nvidia.com" and e["data"]["parentUUID"].startswith("GPU-")
               for e in entries)


def test_an_overlap_is_refused_before_nvml_naming_both_claims(seen: dict[str, Any]) -> None:
    # Allocations the counters forbid (forged, or raced with a slice update) are refused by what the
    # devices occupy, before any NVML call: a placement over another claim's slices, the whole GPU
    # under claims' MIG devices.
    overlap = seen["overlap"]
    assert overlap["cause"] == "device_busy"
    assert "gpu-0-mig-3g40gb-9-4 overlaps device gpu-0-mig-2g20gb-14-4" in overlap["error"]
    assert "claim default/overlap" in overlap["error"] and "claim default/mid" in overlap["error"]
    assert seen["live_after_overlap"] == seen["live_after_three"]
    whole = seen["whole_while_mig"]
    assert "device gpu-0 overlaps device gpu-0-mig-" in whole and "claim default/whole" in whole


def test_a_restart_keeps_the_claims_and_their_mig_devices_published(seen: dict[str, Any]) -> None:
    after = seen["after_restart"]
    assert after["prepared"] == ["u-big", "u-mid", "u-small"]
    assert after["live"] == seen["live_after_three"]
    assert after["published"] == 26  # its own MIG devices are not foreign


def test_a_reboot_loses_the_mig_devices_and_the_next_prepare_makes_them_again(seen: dict[str, Any]) -> None:
    assert seen["live_after_reboot"] == []
    remade = seen["remade"]
    assert remade["error"] == "" and remade["changed"]
    assert remade["live"] == ["1g.10gb@6"]
    assert list(remade["spec_uuid"]) == ["gpu-0-mig-1g10gb-19-6"]


def test_unprepare_destroys_and_a_foreign_mig_device_is_kept_and_refused(seen: dict[str, Any]) -> None:
    assert seen["unprepare"] == {"u-big": "", "u-mid": "", "u-small": ""}
    assert seen["live_after_unprepare"] == []
    foreign = seen["foreign"]
    assert foreign["cause"] == "mig_create" and "this plugin did not make it" in foreign["error"]
    assert seen["live_with_foreign"] == ["1g.10gb@6"]  # only the foreign one: nothing half-made
    published = seen["published_with_foreign"]
    assert "gpu-0" not in published and "gpu-0-mig-1g10gb-19-6" not in published
    assert "gpu-0-mig-7g80gb-0-0" not in published and "gpu-0-mig-1g20gb-15-6" not in published


def test_the_whole_gpu_and_mig_devices_take_turns_through_the_mig_mode(seen: dict[str, Any]) -> None:
    assert seen["whole"] == {"error": "", "mig_mode": 0}
    assert seen["mig_again"] == {"error": "", "mig_mode": 1, "live": ["1g.10gb@6"]}
    assert seen["live_at_end"] == []
