"""The claim transaction killed (SIGKILL) at every step of a dynamic-MIG prepare and unprepare.

Each point is a fresh node (the stand-in NVML on one H100): an admin's MIG device at slice 6 and
claim B prepared at slice 5; then claim A (3g.40gb at slice 0, 1g.10gb at slice 4) is prepared, or
prepared and unprepared, by a process killed right after its N-th changing NVML call (the stand-in's
fault point) or its K-th checkpoint save, walking N and K up until the process runs to its end. The
plugin then starts again and the kubelet retries. After every kill:

- nothing nvdp made is taken for foreign, even before the start replays the record;
- the retry succeeds;
- NVML holds exactly the MIG devices the checkpoint names, plus the admin's; no GPU instance is left
  without a compute instance;
- the admin's device and claim B's are never destroyed, and B's keeps its UUID.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sim.nvml import NodeSim

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# Changing NVML calls of A's prepare: GPU instance and compute instance, twice; of its unprepare: the
# two GPU instances' destroys (each with its compute instance first).
MAX_POINTS = 30  # a bound on the walk: a transaction with more steps than this fails the test


class Node:
    def __init__(self, base: Path, template: Path | None = None) -> None:
        """A node in `base`; with `template`, a copy of that node's NVML state and plugin files."""
        self.base = base
        if template is not None:
            shutil.copytree(template / "state", base / "state", symlinks=True)
            shutil.copytree(template / "work", base / "work", symlinks=True)
        self.sim = NodeSim("h100-mig-dynamic", base / "state")
        self.sim.__enter__()
        self.work = base / "work"
        self.work.mkdir(exist_ok=True)
        self.gpu = self.sim.inventory.gpus[0].uuid

    def run(self, action: str, *, kill_nvml: int = 0, kill_saves: int = 0) -> tuple[int, dict[str, Any]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")}
        env.update(self.sim.env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])
        env.pop("CRASH_AFTER_SAVES", None)
        if kill_nvml:
            env["NVML_SIM_KILL_AFTER"] = str(kill_nvml)
        if kill_saves:
            env["CRASH_AFTER_SAVES"] = str(kill_saves)
        done = subprocess.run([sys.executable, "-m", "tests.dra.crash_scenario", str(self.sim.state_dir),
                               str(self.work), action], env=env, cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=120, check=False)
        if done.returncode == 0:
            return 0, json.loads(done.stdout)
        assert done.returncode == -9, f"{action} failed: {done.stderr[-3000:]}"
        return -9, {}

    def close(self) -> None:
        self.sim.__exit__(None, None, None)


def fresh(tmp: Path, n: int) -> tuple[Node, dict[str, Any]]:
    node = Node(tmp / f"point-{n}")
    rc, setup = node.run("setup")
    assert rc == 0 and setup["answer"] == "", setup
    return node, setup


def check_after_restart(node: Node, setup: dict[str, Any], retry: str) -> dict[str, Any]:
    """The invariants after a kill: before and after the start's replay and the kubelet's retry."""
    rc, after = node.run(retry)
    assert rc == 0
    assert after["foreign_before_start"] == [setup["admin"]], "only the admin's device is foreign"
    assert after["answer"] == "", after
    live = set(after["live"])
    owned = {u for e in after["checkpoint"].values() for u in e["made"]}
    assert live == owned | {setup["admin"]}, "NVML holds the checkpoint's devices and the admin's"
    assert after["bare"] == [], "no GPU instance without its compute instance"
    b_uuid = after["checkpoint"]["u-b"]["made"]
    assert b_uuid and b_uuid[0] in live and b_uuid == setup["checkpoint"]["u-b"]["made"], "B untouched"
    assert all(e["state"] == "PrepareCompleted" for e in after["checkpoint"].values())
    return after


def walk(tmp: Path, kind: str, action: str, before: list[str], retry: str) -> int:
    """Kill `action` at every point of `kind` in turn; the number of points where it was killed."""
    killed = 0
    # The node as every point starts it, made once and copied: an admin's device, claim B, `before`.
    template, setup = fresh(tmp, 0)
    for step in before:
        assert template.run(step)[1]["answer"] == ""
    template.close()
    for n in range(1, MAX_POINTS + 1):
        node = Node(tmp / f"point-{n}", template=template.base)
        try:
            rc, _ = node.run(action, **{kind: n})
            if rc == 0:
                return killed
            killed += 1
            after = check_after_restart(node, setup, retry)
            if retry == "prepare":
                assert set(after["checkpoint"]["u-a"]["made"]) == set(after["specs"]["u-a"].values())
                assert len(after["checkpoint"]["u-a"]["made"]) == 2
            else:
                assert "u-a" not in after["checkpoint"] and "u-a" not in after["specs"]
        finally:
            node.close()
    raise AssertionError(f"{action} was still killed at point {MAX_POINTS}")


@pytest.mark.parametrize(("kind", "action", "before", "retry"), [
    ("kill_nvml", "prepare", [], "prepare"),
    ("kill_saves", "prepare", [], "prepare"),
    ("kill_nvml", "unprepare", ["prepare"], "unprepare"),
    ("kill_saves", "unprepare", ["prepare"], "unprepare"),
], ids=["prepare-nvml", "prepare-checkpoint", "unprepare-nvml", "unprepare-checkpoint"])
def test_killed_at_every_step_the_restart_and_retry_leave_exactly_what_the_record_says(
        tmp_path: Path, kind: str, action: str, before: list[str], retry: str) -> None:
    points = walk(tmp_path, kind, action, before, retry)
    minimum = {("kill_nvml", "prepare"): 4, ("kill_saves", "prepare"): 9,
               ("kill_nvml", "unprepare"): 4, ("kill_saves", "unprepare"): 3}[(kind, action)]
    assert points >= minimum, f"only {points} kill points: the transaction has fewer steps than it should"
    print(f"{action} killed at {points} {kind} points")


def test_an_admins_device_made_where_the_claims_was_is_never_destroyed(tmp_path: Path) -> None:
    """An admin deletes nvdp's MIG device and makes their own at the same place (NVML gives it the same
    GPU instance id): the claim's unprepare answers OK and leaves the admin's device alone."""
    node, setup = fresh(tmp_path, 0)
    try:
        assert node.run("prepare")[1]["answer"] == ""
        rc, remade = node.run("remake-foreign")
        assert rc == 0 and remade["same_gi_id"], "the stand-in reuses the id, as NVML does"
        rc, after = node.run("unprepare")
        assert rc == 0 and after["answer"] == ""
        assert remade["admin_remade"] in after["live"]
        b = after["checkpoint"]["u-b"]["made"]
        assert set(after["live"]) == {setup["admin"], remade["admin_remade"], *b}
    finally:
        node.close()
