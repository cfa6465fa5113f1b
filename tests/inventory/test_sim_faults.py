"""The stand-in NVML's fault points for crash tests: a process killed (SIGKILL) right after its N-th NVML call
that changed a GPU's state, or that call refused with an NVML code, armed through the state directory or
NVML_SIM_KILL_AFTER; and what a crash leaves behind, as NVML lists it to the next process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sim.nvml import NodeSim

from .conftest import python_env

pytestmark = pytest.mark.slow  # starts processes

IN_USE, INSUFFICIENT_RESOURCES = 19, 23
GI_1G, CI_1G = 19, 0  # the 1g.10gb GPU-instance profile id on an H100, and its compute-instance profile

# Runs the actions in argv (or, after `--wait`, one per line of its input) through pynvml and prints one
# JSON line per action: [action, NVML return code]. `gi:S` makes a 1g.10gb GPU instance at memory slice S
# (with its placement), `ci` a compute instance over the last one made, `dci`/`dgi` destroy them, `mode:M`
# sets compute mode M.
CHILD = f"GI, CI = {GI_1G}, {CI_1G}\n" + """
import ctypes, json, sys
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByUUID(sys.argv[1])
made = {}

def act(action):
    if action.startswith("gi:"):
        placement = n.c_nvmlGpuInstancePlacement_t(int(action[3:]), 1)
        made["gi"] = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, GI, ctypes.byref(placement))
    elif action == "ci":
        made["ci"] = n.nvmlGpuInstanceCreateComputeInstance(made["gi"], CI)
    elif action == "dci":
        n.nvmlComputeInstanceDestroy(made.pop("ci"))
    elif action == "dgi":
        n.nvmlGpuInstanceDestroy(made.pop("gi"))
    elif action.startswith("mode:"):
        n.nvmlDeviceSetComputeMode(h, int(action[5:]))
    n.nvmlDeviceGetMigMode(h)  # calls that change nothing are not counted

def run(action):
    try:
        act(action)
        code = 0
    except n.NVMLError as e:
        code = e.value
    print(json.dumps([action, code]), flush=True)

if sys.argv[2:] == ["--wait"]:
    print("READY", flush=True)
    for line in sys.stdin:
        run(line.strip())
else:
    for action in sys.argv[2:]:
        run(action)
"""


def child(node: NodeSim, *actions: str, env: dict[str, str] | None = None) -> tuple[int, list[list[Any]]]:
    """Runs CHILD on the node's first GPU; its exit status and the answers it printed."""
    done = subprocess.run([sys.executable, "-c", CHILD, node.inventory.gpus[0].uuid, *actions],
                          env=python_env({**node.env, **(env or {})}), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


def layout(node: NodeSim) -> list[tuple[int, int, int, list[int]]]:
    """The GPU's instances as NVML lists them: (GI id, start, size, CI ids) each."""
    return [(gi["gi_id"], gi["start"], gi["size"], gi["ci_ids"])
            for gi in node.gpu_instances(node.inventory.gpus[0].uuid)]


@pytest.fixture
def node(tmp_path: Path) -> NodeSim:
    return NodeSim("h100-mig-dynamic", tmp_path / "state")


def test_killed_after_its_gpu_instance_leaves_it_without_compute_instance(node: NodeSim) -> None:
    node.kill_after(1)
    code, answers = child(node, "gi:3", "ci")
    assert code == -signal.SIGKILL
    assert answers == []  # killed inside the call, before pynvml returned
    gpu = node.inventory.gpus[0].uuid
    # Listed by nvmlDeviceGetGpuInstances, with nvmlGpuInstanceGetInfo's id, profile and placement, and
    # no compute instance (nvmlGpuInstanceGetComputeInstances), in a process of its own.
    assert node.gpu_instances(gpu) == [
        {"gi_id": 10, "gi_profile_id": GI_1G, "profile": "1g.10gb", "start": 3, "size": 1, "ci_ids": []}
    ]
    assert [(m["gi_id"], m["ci_id"], m["uuid"]) for m in node.mig_instances(gpu)] == [(10, None, None)]
    node.clear_faults()
    node.mig_destroy(gpu, 10)  # what a plugin cleaning up after the crash does
    assert layout(node) == []


def test_walking_the_kill_point_over_every_change(node: NodeSim) -> None:
    actions = ("gi:0", "ci", "dci", "dgi")
    after = [
        [(7, 0, 1, [])],  # GI made
        [(7, 0, 1, [0])],  # CI made
        [(7, 0, 1, [])],  # CI destroyed
        [],  # GI destroyed
    ]
    for n in range(1, len(actions) + 2):
        node.reboot()
        node.kill_after(n)
        code, answers = child(node, *actions)
        if n <= len(actions):
            assert (code, answers) == (-signal.SIGKILL, [[a, 0] for a in actions[: n - 1]]), n
            assert layout(node) == after[n - 1], n
        else:  # fewer changes than n: nobody is killed
            assert (code, answers) == (0, [[a, 0] for a in actions])
            assert layout(node) == []


def test_refused_calls_do_not_count_for_kill_after(node: NodeSim) -> None:
    node.kill_after(2)
    # The refused second GI (same memory slice) changes nothing and does not count; the CI does.
    code, answers = child(node, "gi:5", "gi:5", "ci", "dci")
    assert code == -signal.SIGKILL
    assert answers == [["gi:5", 0], ["gi:5", INSUFFICIENT_RESOURCES]]
    assert layout(node) == [(12, 5, 1, [0])]


def test_compute_mode_is_a_change_too(node: NodeSim) -> None:
    node.kill_after(1)
    code, answers = child(node, "mode:3")
    assert (code, answers) == (-signal.SIGKILL, [])
    assert node.compute_mode(node.inventory.gpus[0].uuid) == "EXCLUSIVE_PROCESS"  # written before dying


def test_environment_variable_kills_too(node: NodeSim) -> None:
    code, answers = child(node, "gi:1", "ci", "gi:2", env={"NVML_SIM_KILL_AFTER": "2"})
    assert (code, answers) == (-signal.SIGKILL, [["gi:1", 0]])
    assert layout(node) == [(8, 1, 1, [0])]


def test_fail_after_refuses_the_named_call_and_changes_nothing(node: NodeSim) -> None:
    node.fail_after(1, INSUFFICIENT_RESOURCES)
    code, answers = child(node, "gi:0", "gi:0")
    # Only the first call is refused; the next one runs.
    assert (code, answers) == (0, [["gi:0", INSUFFICIENT_RESOURCES], ["gi:0", 0]])
    assert layout(node) == [(7, 0, 1, [])]

    node.reboot()
    node.fail_after(2, IN_USE)  # a refused call counts: the third call of this process runs
    code, answers = child(node, "gi:4", "ci", "ci")
    assert (code, answers) == (0, [["gi:4", 0], ["ci", IN_USE], ["ci", 0]])
    assert layout(node) == [(11, 4, 1, [0])]

    node.reboot()
    node.fail_after(1, INSUFFICIENT_RESOURCES)
    before = sorted(p.name for p in (node.state_dir / "mig").iterdir())
    code, answers = child(node, "gi:6")
    assert answers == [["gi:6", INSUFFICIENT_RESOURCES]]
    assert sorted(p.name for p in (node.state_dir / "mig").iterdir()) == before  # no layout file written
    assert layout(node) == []


class Waiting:
    """CHILD kept running on the node's first GPU, doing one action per `ask`."""

    def __init__(self, node: NodeSim) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, node.inventory.gpus[0].uuid, "--wait"],
                                     env=python_env(node.env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.read() == "READY"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def ask(self, action: str) -> Any:
        """The action's [action, code]; None when the process died doing it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(action + "\n")
        self.proc.stdin.flush()
        line = self.read()
        return json.loads(line) if line else None

    def close(self) -> int:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        return self.proc.wait(timeout=30)


def test_a_pid_limits_the_fault_to_that_process_armed_after_it_started(node: NodeSim) -> None:
    waiting = Waiting(node)
    try:
        assert waiting.ask("gi:0") == ["gi:0", 0]  # before any arming: not counted
        node.kill_after(1, waiting.pid)
        node.fail_after(1, INSUFFICIENT_RESOURCES, waiting.pid)
        # Another process: neither killed nor refused.
        assert child(node, "gi:2", "ci") == (0, [["gi:2", 0], ["ci", 0]])
        # The armed one: its first change since the arming is refused, the next one kills it once made.
        assert waiting.ask("ci") == ["ci", INSUFFICIENT_RESOURCES]
        assert waiting.ask("ci") is None
    finally:
        assert waiting.close() == -signal.SIGKILL
    assert layout(node) == [(7, 0, 1, [0]), (9, 2, 1, [0])]


def test_arming_again_restarts_the_count(node: NodeSim) -> None:
    waiting = Waiting(node)
    try:
        node.kill_after(2, waiting.pid)
        assert waiting.ask("gi:6") == ["gi:6", 0]  # 1 of 2
        node.kill_after(2, waiting.pid)  # the file written anew
        assert waiting.ask("ci") == ["ci", 0]  # 1 of 2 again
        assert waiting.ask("dci") is None  # 2: killed once the compute instance is gone
    finally:
        assert waiting.close() == -signal.SIGKILL
    assert layout(node) == [(13, 6, 1, [])]
    node.clear_faults()
    assert child(node, "gi:4", "ci") == (0, [["gi:4", 0], ["ci", 0]])
