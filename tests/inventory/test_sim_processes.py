"""The stand-in NVML's running processes, chosen by a test (processes/<uuid>), read through the real
pynvml in another process: compute processes and MPS clients with their memory, per-process SM
utilization samples, MIG devices and their GPU, errors, and nvdp's reading of all of it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sim.nvml import NodeSim, RunningProcess, set_processes

from .conftest import RunPy, line_process

pytestmark = pytest.mark.slow  # starts processes

GIB = 1 << 30

# One JSON line per UUID read: what NVML lists on it, and the utilization samples since a timestamp.
PROBE = """
import json, sys, time
import pynvml as n

def call(f):
    try:
        return f()
    except n.NVMLError as e:
        return f"error {e.value}"

def procs(listing):
    return [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in listing]

def read(uuid, since):
    h = n.nvmlDeviceGetHandleByUUID(uuid)
    return {
        "compute": call(lambda: procs(n.nvmlDeviceGetComputeRunningProcesses(h))),
        "mps": call(lambda: procs(n.nvmlDeviceGetMPSComputeRunningProcesses_v3(h))),
        "util": call(lambda: sorted((s.pid, s.smUtil, s.memUtil, s.timeStamp > since)
                                    for s in n.nvmlDeviceGetProcessUtilization(h, since))),
    }

n.nvmlInit()
print("READY", flush=True)
for line in sys.stdin:
    uuid, since = line.split()
    since = int(time.time() * 1e6) + int(since)
    print(json.dumps(read(uuid, since)), flush=True)
"""

READ = """
import json, msgspec
from nvdp.inventory.nvml import NvmlSession
from nvdp.inventory.processes import read_processes
with NvmlSession():
    print(json.dumps(msgspec.to_builtins(read_processes())))
"""
NO_ID = 0xFFFFFFFF


def ask(proc: subprocess.Popen[str], uuid: str, since_offset_us: int = -10_000_000) -> dict[str, object]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{uuid} {since_offset_us}\n")
    proc.stdin.flush()
    answer: dict[str, object] = json.loads(proc.stdout.readline())
    return answer


def test_a_gpu_runs_nothing_until_a_test_says_what(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("t4")
    gpu = node.inventory.gpus[0].uuid
    with line_process(node, PROBE) as proc:
        assert ask(proc, gpu) == {"compute": [], "mps": [], "util": "error 6"}  # NOT_FOUND: no sample
        node.set_processes(gpu, [RunningProcess(4242, GIB, sm_util=35, mem_util=10),
                                 RunningProcess(77, None),  # no memory figure, no sample
                                 RunningProcess(99, 256 << 20, sm_util=5, mps=True)])
        assert ask(proc, gpu) == {  # the running process sees the change at its next call
            "compute": [[4242, GIB, NO_ID, NO_ID], [77, None, NO_ID, NO_ID]],
            "mps": [[99, 256 << 20, NO_ID, NO_ID]],
            "util": [[99, 5, 0, True], [4242, 35, 10, True]],
        }
        assert ask(proc, gpu, since_offset_us=10_000_000)["util"] == "error 6"  # none newer than asked
        node.set_processes(gpu, [])
        assert ask(proc, gpu)["compute"] == []


def test_mig_devices_list_their_own_their_gpu_all_and_neither_has_utilization(
        make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("h100-mig-8")
    gpu = node.inventory.gpus[1]
    first, second = gpu.mig_devices[:2]
    node.set_processes(first.uuid, [RunningProcess(10, GIB, sm_util=50)])
    node.set_processes(second.uuid, [RunningProcess(20, 2 * GIB)])
    with line_process(node, PROBE) as proc:
        mig = ask(proc, first.uuid)
        assert mig == {"compute": [[10, GIB, first.gi_id, first.ci_id]], "mps": [], "util": "error 3"}
        parent = ask(proc, gpu.uuid)
        assert parent == {"compute": [[10, GIB, first.gi_id, first.ci_id], [20, 2 * GIB, second.gi_id,
                                                                           second.ci_id]],
                          "mps": [], "util": "error 3"}  # NOT_SUPPORTED in MIG mode


def test_a_file_that_is_not_a_process_list_is_an_error_named_on_stderr(
        make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node("t4")
    gpu = node.inventory.gpus[0].uuid
    (node.state_dir / "processes").mkdir()
    (node.state_dir / "processes" / gpu).write_text('[{"pid": 0}]')
    code = ("import pynvml as n\nn.nvmlInit()\ntry:\n    n.nvmlDeviceGetComputeRunningProcesses("
            "n.nvmlDeviceGetHandleByIndex(0))\nexcept n.NVMLError as e:\n    print(e.value)")
    done = run_py(code, node.env)
    assert done.stdout.strip() == "999"  # NVML_ERROR_UNKNOWN
    assert f"nvml-sim: {node.state_dir}/processes/{gpu}: an entry has no pid > 0" in done.stderr
    with pytest.raises(ValueError, match="sm_util 101 is not a percentage"):
        set_processes(node.state_dir, gpu, [RunningProcess(1, sm_util=101)])
    with pytest.raises(ValueError, match="is not a GPU or MIG device"):
        node.set_processes("GPU-nope", [RunningProcess(1)])


def test_nvdp_reads_every_device_and_names_the_ones_nvml_cannot(
        make_node: Callable[[str], NodeSim], run_py: RunPy) -> None:
    node = make_node("h100-mig-8")
    mig = node.inventory.gpus[0].mig_devices[0]
    node.set_processes(mig.uuid, [RunningProcess(10, GIB, sm_util=50), RunningProcess(11, None, mps=True)])
    node.lose_gpu(node.inventory.gpus[7].uuid)
    done = run_py(READ, node.env)
    assert done.returncode == 0, done.stderr
    reading = json.loads(done.stdout)
    devices = {d["uuid"]: d for d in reading["devices"]}
    assert devices[mig.uuid] == {"uuid": mig.uuid, "gpu_uuid": node.inventory.gpus[0].uuid,
                                 "processes": [{"pid": 10, "memory_bytes": GIB, "sm_util": None},
                                               {"pid": 11, "memory_bytes": None, "sm_util": None}],
                                 "utilization": False}
    assert len(devices) == sum(len(g.mig_devices) for g in node.inventory.gpus[:7])
    assert reading["unreadable"] == [f"{node.inventory.gpus[7].uuid} (ERROR_GPU_IS_LOST)"]

    t4 = make_node("t4")
    gpu = t4.inventory.gpus[0].uuid
    t4.set_processes(gpu, [RunningProcess(4242, GIB, sm_util=35), RunningProcess(77, 5)])
    whole = json.loads(run_py(READ, t4.env).stdout)["devices"]
    assert whole == [{"uuid": gpu, "gpu_uuid": gpu, "utilization": True,
                      "processes": [{"pid": 77, "memory_bytes": 5, "sm_util": 0},  # no sample: idle
                                    {"pid": 4242, "memory_bytes": GIB, "sm_util": 35}]}]


def test_the_shell_command_sets_and_clears_a_devices_processes(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("t4")
    gpu = node.inventory.gpus[0].uuid
    root = Path(__file__).resolve().parents[2]

    def shell(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "sim.nvml", "processes", "--state-dir", str(node.state_dir),
                   "--uuid", gpu, *args]
        return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=60, check=False)

    assert shell('[{"pid": 7, "usedGpuMemory": 1024, "smUtil": 3}]').returncode == 0
    assert json.loads((node.state_dir / "processes" / gpu).read_text()) == [
        {"pid": 7, "memUtil": 0, "mps": False, "usedGpuMemory": 1024, "smUtil": 3}]
    refused = shell('[{"pid": 7, "memory": 1}]')
    assert refused.returncode == 2 and "unknown key(s) memory" in refused.stderr
    assert shell().returncode == 0
    assert not (node.state_dir / "processes" / gpu).exists()
