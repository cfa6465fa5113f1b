"""Run-time injection seen through a raw pynvml event loop in another process, and persisted compute mode."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from sim.nvml import NodeSim

from .conftest import line_process

pytestmark = pytest.mark.slow  # starts processes

RunPy = Callable[..., subprocess.CompletedProcess[str]]

# Registers every GPU, prints READY, then reports each event it waits for (one per stdin line).
EVENT_LOOP = """
import sys
import pynvml as n
n.nvmlInit()
events = n.nvmlEventSetCreate()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    n.nvmlDeviceRegisterEvents(h, n.nvmlDeviceGetSupportedEventTypes(h), events)
print("READY", flush=True)
for command in sys.stdin:
    try:
        e = n.nvmlEventSetWait_v2(events, int(command))
    except n.NVMLError as err:
        print("ERROR", err.value, flush=True)
        continue
    uuid = n.nvmlDeviceGetUUID(e.device)
    try:
        n.nvmlDeviceGetMemoryInfo(e.device)
        state = "ok"
    except n.NVMLError as err:
        state = f"error-{err.value}"
    print("EVENT", uuid, e.eventType, e.eventData, e.gpuInstanceId, e.computeInstanceId, state, flush=True)
n.nvmlEventSetFree(events)
n.nvmlShutdown()
"""


class EventLoop:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def wait(self, timeout_ms: int) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{timeout_ms}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()


@contextmanager
def event_loop(node: NodeSim) -> Iterator[EventLoop]:
    with line_process(node, EVENT_LOOP) as proc:
        yield EventLoop(proc)


XID = 8  # nvmlEventTypeXidCriticalError
NO_ID = 0xFFFFFFFF


def test_xid_on_gpu_and_mig_device(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("h100-mig-8")
    gpu = node.inventory.gpus[4]
    mig = gpu.mig_devices[2]  # the 1g.10gb+me
    node.inject_xid(gpu.uuid, 13)  # before the loop initialised NVML: not delivered
    with event_loop(node) as loop:
        node.inject_xid(gpu.uuid, 48)
        node.inject_xid(mig.uuid, 94)
        assert loop.wait(5000) == ["EVENT", gpu.uuid, str(XID), "48", str(NO_ID), str(NO_ID), "ok"]
        assert loop.wait(5000) == ["EVENT", gpu.uuid, str(XID), "94", str(mig.gi_id), str(mig.ci_id), "ok"]
        assert loop.wait(20) == ["ERROR", "10"]  # NVML_ERROR_TIMEOUT once nothing is left


def test_gpu_lost_after_start(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("mixed-4")
    gpu = node.inventory.gpus[3]
    with event_loop(node) as loop:
        node.lose_gpu(gpu.uuid)
        # XID 79 arrives from the lost GPU, which can still be named but no longer queried.
        assert loop.wait(5000) == ["EVENT", gpu.uuid, str(XID), "79", str(NO_ID), str(NO_ID), "error-15"]


def test_wait_times_out_without_events(make_node: Callable[[str], NodeSim]) -> None:
    with event_loop(make_node("t4")) as loop:
        assert loop.wait(50) == ["ERROR", "10"]


def test_register_events_errors(make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node("h100-mig-8")
    code = """
import pynvml as n
n.nvmlInit()
s = n.nvmlEventSetCreate()
mig = n.nvmlDeviceGetMigDeviceHandleByIndex(n.nvmlDeviceGetHandleByIndex(0), 0)
for call in (lambda: n.nvmlDeviceRegisterEvents(mig, 8, s), lambda: n.nvmlDeviceGetSupportedEventTypes(mig)):
    try:
        call()
    except n.NVMLError as e:
        print(e.value)
"""
    assert run_py(code, node.env).stdout.split() == ["3", "3"]  # NOT_SUPPORTED on MIG handles


def test_compute_mode_persists_across_processes(make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node("mixed-4")
    uuid = node.inventory.gpus[1].uuid
    set_mode = """
import sys
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByUUID(sys.argv[1])
before = n.nvmlDeviceGetComputeMode(h)
n.nvmlDeviceSetComputeMode(h, int(sys.argv[2]))
print(before)
"""
    assert node.compute_mode(uuid) == "DEFAULT"
    assert run_py(set_mode, node.env, uuid, "3").stdout.split() == ["0"]
    assert node.compute_mode(uuid) == "EXCLUSIVE_PROCESS"
    assert node.compute_mode(node.inventory.gpus[0].uuid) == "DEFAULT"
    assert run_py(set_mode, node.env, uuid, "0").stdout.split() == ["3"]  # another process saw it
    assert node.compute_mode(uuid) == "DEFAULT"


def test_node_sim_rejects_unknown_devices(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("h100-mig-8")
    with pytest.raises(ValueError) as err:
        node.inject_xid("GPU-nope", 48)
    assert str(err.value) == "GPU-nope is not a GPU or MIG device of node profile h100-mig-8.yaml"
    mig = node.inventory.gpus[0].mig_devices[0].uuid
    with pytest.raises(ValueError) as err:
        node.lose_gpu(mig)
    assert str(err.value) == f"{mig} is a MIG device; only a whole GPU can fall off the bus"


def test_cli_injects_into_a_running_loop(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("t4")
    uuid = node.inventory.gpus[0].uuid
    with event_loop(node) as loop:
        cli = [sys.executable, "-m", "sim.nvml", "inject-xid", "--state-dir", str(node.state_dir)]
        subprocess.run([*cli, "--uuid", uuid, "--xid", "31"], check=True, cwd=str(node.library.parents[2]))
        assert loop.wait(5000)[:4] == ["EVENT", uuid, str(XID), "31"]


def test_second_thread_queries_while_waiting(make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node("a100-sxm-8")
    uuid = node.inventory.gpus[5].uuid
    code = """
import os, sys, threading
import pynvml as n
n.nvmlInit()
events = n.nvmlEventSetCreate()
handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
for h in handles:
    n.nvmlDeviceRegisterEvents(h, 8, events)
seen = []
waiter = threading.Thread(target=lambda: seen.append(n.nvmlEventSetWait_v2(events, 10000)))
waiter.start()
names = {n.nvmlDeviceGetName(h) for _ in range(50) for h in handles}
levels = {n.nvmlDeviceGetTopologyCommonAncestor(handles[0], h) for h in handles[1:]}
with open(os.path.join(os.environ["NVML_SIM_STATE_DIR"], "events"), "a") as f:
    f.write(sys.argv[1] + " 63\\n")
waiter.join()
print(sorted(names), sorted(levels), n.nvmlDeviceGetUUID(seen[0].device), seen[0].eventData)
"""
    result = run_py(code, node.env, uuid)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"['NVIDIA A100-SXM4-40GB'] [20, 40, 50] {uuid} 63"
