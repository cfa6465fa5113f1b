"""The stand-in NVML's MIG: GPU-instance profiles and placements as a real H100 answers them
(docs/mig-nvml-h100.md), GPU and compute instances made and destroyed by the driver's rules, and the
layout shared by every process of the node. Read through the real pynvml in other processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.nvml import PROFILES_DIR, REPO_ROOT, MigError, NodeSim

from .conftest import line_process, python_env

pytestmark = pytest.mark.slow  # starts processes

H100 = "GPU-5d3e8c1a-4f27-4b90-9e61-2a7c0d9b3f48"  # h100-mig-dynamic
INVALID_ARGUMENT, NOT_SUPPORTED, INSUFFICIENT_SIZE, IN_USE, INSUFFICIENT_RESOURCES = 2, 3, 7, 19, 23

PRELUDE = """
import ctypes, json, sys
import pynvml as n
n.nvmlInit()
out = {}

def code(f):
    try:
        f()
        return 0
    except n.NVMLError as e:
        return e.value

def create(h, profile_id, start, size):
    placement = n.c_nvmlGpuInstancePlacement_t(start, size)
    return n.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, ctypes.byref(placement))

def gi_info(gi):
    info = n.nvmlGpuInstanceGetInfo(gi)
    return [info.id, info.profileId, info.placement.start, info.placement.size]

def placements(h, profile_id):
    f = n._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
    count = ctypes.c_uint(0)
    assert f(h, profile_id, None, ctypes.byref(count)) == 0
    slots = (n.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    assert f(h, profile_id, slots, ctypes.byref(count)) == 0
    return [[slots[k].start, slots[k].size] for k in range(count.value)]
"""


def probe(node: NodeSim, body: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PRELUDE + body + "\nprint(json.dumps(out))"],
                          env=python_env(node.env), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def recorded_h100_table() -> dict[int, Any]:
    """docs/mig-nvml-h100.md's table: profile index -> the answer fields, or the NVML error's name."""
    rows: dict[int, Any] = {}
    text = (REPO_ROOT / "docs" / "mig-nvml-h100.md").read_text(encoding="utf-8")
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 12 or not re.match(r"^\d", cells[0]):
            continue
        if cells[-1] in ("NOT_SUPPORTED", "INVALID_ARGUMENT"):
            for part in cells[0].split(","):
                low, _, high = part.strip().partition("-")
                for index in range(int(low), int(high or low) + 1):
                    rows[index] = cells[-1]
            continue
        pairs = [[int(a), int(b)] for a, b in re.findall(r"\((\d+),(\d+)\)", cells[-1])]
        if "..." in cells[-1]:  # "(0,1) ... (6,1)": every start between, one size apart
            (first, size), (last, _) = pairs[0], pairs[-1]
            pairs = [[start, size] for start in range(first, last + 1, size)]
        index = int(cells[0].split()[0])
        numbers = [int(c) for c in cells[2:11]]
        rows[index] = {"name": cells[1], "id": numbers[0], "slices": numbers[1], "instances": numbers[2],
                       "sms": numbers[3], "memory": numbers[4], "ce": numbers[5], "dec": numbers[6],
                       "jpeg": numbers[7], "ofa": numbers[8], "enc": 0, "placements": pairs}  # fmt: skip
    assert sorted(rows) == list(range(18)), "the table names every profile index 0..17"
    return rows


TABLE_PROBE = """
h = n.nvmlDeviceGetHandleByIndex(int(sys.argv[1]) if len(sys.argv) > 1 else GPU)
for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
    try:
        i = n.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
    except n.NVMLError as e:
        out[index] = {2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED"}.get(e.value, e.value)
        continue
    name = i.name.decode() if isinstance(i.name, bytes) else i.name
    out[index] = {"name": name, "id": i.id, "slices": i.sliceCount, "instances": i.instanceCount,
                  "sms": i.multiprocessorCount, "memory": i.memorySizeMB, "ce": i.copyEngineCount,
                  "dec": i.decoderCount, "jpeg": i.jpegCount, "ofa": i.ofaCount, "enc": i.encoderCount,
                  "placements": placements(h, i.id),
                  "remaining": n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, i.id)}
"""


@pytest.mark.parametrize(("profile", "gpu"), [("h100-mig-empty", 1), ("h100-mig-dynamic", 0)])
def test_h100_answers_as_the_recorded_real_gpu(profile: str, gpu: int, tmp_path: Path) -> None:
    """MIG mode off (as the recorded GPU) and on: the same profiles, placements and free capacity."""
    answers = probe(NodeSim(profile, tmp_path / "state"), f"GPU = {gpu}\n" + TABLE_PROBE)
    for index, expected in recorded_h100_table().items():
        got = answers[str(index)]
        if isinstance(expected, dict):
            assert got.pop("remaining") == expected["instances"], index
        assert got == expected, index


def test_placement_rules(tmp_path: Path) -> None:
    node = NodeSim("h100-mig-dynamic", tmp_path / "state")
    out = probe(node, """
h = n.nvmlDeviceGetHandleByIndex(0)
half = create(h, 9, 0, 4)                                   # 3g.40gb on memory slices 0-3
out["half"] = gi_info(half)
out["overlap"] = code(lambda: create(h, 19, 1, 1))          # 1g.10gb inside it
out["not_a_placement"] = code(lambda: create(h, 9, 2, 4))   # 3g.40gb starts at 0 or 4 only
out["past_the_slices"] = code(lambda: create(h, 19, 7, 1))  # 1g.10gb placements are 0..6
out["unknown_profile"] = code(lambda: create(h, 99, 0, 1))
me = create(h, 20, 4, 1)                                    # 1g.10gb+me: one at a time
out["me"] = gi_info(me)
out["second_me"] = code(lambda: create(h, 20, 6, 1))
first_free = n.nvmlDeviceCreateGpuInstance(h, 19)           # lowest free placement of 1g.10gb
out["first_free"] = gi_info(first_free)
out["one_more_3g"] = code(lambda: create(h, 9, 4, 4))       # 4-7 are partly taken
out["remaining_1g"] = n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19)
ci = n.nvmlGpuInstanceCreateComputeInstance(half, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
out["destroy_in_use"] = code(lambda: n.nvmlGpuInstanceDestroy(half))
n.nvmlComputeInstanceDestroy(ci)
out["destroy_after_ci"] = code(lambda: n.nvmlGpuInstanceDestroy(half))
out["3g_again"] = gi_info(create(h, 9, 0, 4))
off = n.nvmlDeviceGetHandleByIndex(0)
""")
    assert out["half"] == [1, 9, 0, 4]  # GI ids by placement, as nvidia-smi mig -lgi shows them
    assert out["overlap"] == INSUFFICIENT_RESOURCES
    assert out["not_a_placement"] == INVALID_ARGUMENT
    assert out["past_the_slices"] == INVALID_ARGUMENT
    assert out["unknown_profile"] == INVALID_ARGUMENT
    assert out["me"] == [11, 20, 4, 1]
    assert out["second_me"] == INSUFFICIENT_RESOURCES
    assert out["first_free"] == [12, 19, 5, 1]
    assert out["one_more_3g"] == INSUFFICIENT_RESOURCES
    assert out["remaining_1g"] == 1  # slice 6; slice 7 is no 1g.10gb placement
    assert out["destroy_in_use"] == IN_USE
    assert out["destroy_after_ci"] == 0
    assert out["3g_again"] == [1, 9, 0, 4]


def test_compute_slices_run_out_before_memory_slices(tmp_path: Path) -> None:
    """Seven compute slices per GPU: an eighth one-slice instance is refused although slice 7 is free."""
    profile = yaml.safe_load((PROFILES_DIR / "h100-mig-dynamic.yaml").read_text())
    (gpu,) = profile["gpus"]
    gpu["mig_profiles"] = [{**gpu["mig_profiles"][0], "instances": 8,
                            "placements": [[k, 1] for k in range(8)]}]  # fmt: skip
    path = tmp_path / "eight.yaml"
    path.write_text(yaml.safe_dump(profile))
    out = probe(NodeSim(path, tmp_path / "state"), """
h = n.nvmlDeviceGetHandleByIndex(0)
for start in range(7):
    create(h, 19, start, 1)
out["eighth"] = code(lambda: create(h, 19, 7, 1))
out["remaining"] = n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19)
""")
    assert out == {"eighth": INSUFFICIENT_RESOURCES, "remaining": 0}


def test_refusals_on_gpus_without_mig(tmp_path: Path) -> None:
    out = probe(NodeSim("h100-mig-empty", tmp_path / "state"), """
off = n.nvmlDeviceGetHandleByIndex(1)                       # MIG capable, MIG mode off
out["create_mig_off"] = code(lambda: create(off, 19, 0, 1))
out["instances_mig_off"] = code(lambda: n.nvmlDeviceGetGpuInstances(off, 19, None, None))
f = n._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
count = ctypes.c_uint(3)
slots = (n.c_nvmlGpuInstancePlacement_t * 3)()
out["too_small"] = [f(off, 19, slots, ctypes.byref(count)), count.value]
""")
    assert out == {"create_mig_off": NOT_SUPPORTED, "instances_mig_off": NOT_SUPPORTED,
                   "too_small": [INSUFFICIENT_SIZE, 7]}  # fmt: skip
    v3 = probe(NodeSim("h100-mig-dynamic", tmp_path / "v3"), """
class V3(ctypes.Structure):
    counts = ("version", "id", "sliceCount", "instanceCount", "sms", "ce", "dec", "enc", "jpeg", "ofa")
    _fields_ = [(k, ctypes.c_uint) for k in counts] + [("memorySizeMB", ctypes.c_ulonglong),
                ("name", ctypes.c_char * 96), ("capabilities", ctypes.c_uint)]
f = n._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
info = V3(version=ctypes.sizeof(V3) | 3 << 24)
h = n.nvmlDeviceGetHandleByIndex(0)
out["v3"] = [f(h, 3, ctypes.byref(info)), info.id, info.sliceCount, info.memorySizeMB, info.name.decode()]
info.version = 4 << 24 | ctypes.sizeof(V3)
out["v4"] = f(h, 3, ctypes.byref(info))  # profile index 3: 4g.40gb
""")
    assert v3 == {"v3": [0, 5, 4, 40448, "4g.40gb"], "v4": INVALID_ARGUMENT}
    t4 = probe(NodeSim("t4", tmp_path / "t4"), """
out["info"] = code(lambda: n.nvmlDeviceGetGpuInstanceProfileInfo(n.nvmlDeviceGetHandleByIndex(0), 0))
""")
    assert t4 == {"info": NOT_SUPPORTED}


def test_a_made_instance_is_a_mig_device_until_destroyed(tmp_path: Path) -> None:
    node = NodeSim("h100-mig-dynamic", tmp_path / "state")
    out = probe(node, """
h = n.nvmlDeviceGetHandleByIndex(0)
gi = create(h, 9, 4, 4)
out["ci_profiles"] = {p: code(lambda: n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, 0))
                      for p in range(5)}
full = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
one = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
out["full"] = [full.sliceCount, full.instanceCount, full.multiprocessorCount, full.name]
out["one"] = [one.sliceCount, one.instanceCount, one.multiprocessorCount, one.name]
ci = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
info = n.nvmlComputeInstanceGetInfo(ci)
out["ci"] = [info.id, info.profileId, info.placement.start, info.placement.size]
out["second_ci"] = code(lambda: n.nvmlGpuInstanceCreateComputeInstance(gi, 0))
seven = n.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE
out["ci_too_big"] = code(lambda: n.nvmlGpuInstanceCreateComputeInstance(gi, seven))
mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
uuid = n.nvmlDeviceGetUUID(mig)
out["device"] = [uuid, n.nvmlDeviceGetName(mig), n.nvmlDeviceGetMemoryInfo(mig).total // 2**20,
                 n.nvmlDeviceGetGpuInstanceId(mig), n.nvmlDeviceGetComputeInstanceId(mig),
                 n.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount]
out["by_uuid"] = n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByUUID(uuid)) == uuid
out["second_index"] = code(lambda: n.nvmlDeviceGetMigDeviceHandleByIndex(h, 1))
n.nvmlComputeInstanceDestroy(ci)
out["after"] = [code(lambda: n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)),
                code(lambda: n.nvmlDeviceGetHandleByUUID(uuid)), code(lambda: n.nvmlDeviceGetUUID(mig))]
n.nvmlGpuInstanceDestroy(gi)
out["gi_after"] = code(lambda: n.nvmlGpuInstanceGetInfo(gi))
""")
    assert out["ci_profiles"] == {"0": 0, "1": 0, "2": 0, "3": NOT_SUPPORTED, "4": NOT_SUPPORTED}
    assert out["full"] == [3, 1, 60, "3g.40gb"]
    assert out["one"] == [1, 3, 20, "1c.3g.40gb"]
    assert out["ci"] == [0, 2, 0, 3]
    assert out["second_ci"] == INSUFFICIENT_RESOURCES
    assert out["ci_too_big"] == NOT_SUPPORTED
    uuid, name, memory, gi_id, ci_id, slices = out["device"]
    assert re.match(r"^MIG-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$", uuid)
    assert [name, memory, gi_id, ci_id, slices] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448, 2, 0, 3]
    assert out["by_uuid"] is True
    assert out["second_index"] == 6  # NOT_FOUND
    assert out["after"] == [6, 6, INVALID_ARGUMENT]
    assert out["gi_after"] == INVALID_ARGUMENT


# Answers one line per line read: "list" the MIG devices it enumerates (uuid, gi, ci), "register" every GPU
# for XID events, "wait" for the next event (uuid of its MIG device found by GI/CI ids, and the XID).
WATCHER = """
import json, sys
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
s = None
def devices():
    found = []
    for j in range(7):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except n.NVMLError:
            continue
        ids = [n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m)]
        found.append([n.nvmlDeviceGetUUID(m), *ids])
    return found
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "list":
        print(json.dumps(devices()), flush=True)
    elif line.strip() == "register":
        s = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, s)
        print("[]", flush=True)
    else:
        e = n.nvmlEventSetWait(s, 10000)
        print(json.dumps([e.eventData, e.gpuInstanceId, e.computeInstanceId]), flush=True)
"""


def ask(proc: subprocess.Popen[str], line: str) -> Any:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def test_another_process_sees_instances_at_once(tmp_path: Path) -> None:
    node = NodeSim("h100-mig-dynamic", tmp_path / "state")
    with line_process(node, WATCHER) as watcher:
        assert ask(watcher, "list") == []
        uuid = node.mig_create(H100, 9, 4)
        assert ask(watcher, "list") == [[uuid, 2, 0]]
        ask(watcher, "register")
        node.inject_xid(uuid, 43)  # a MIG device made while the node runs is a known device
        assert ask(watcher, "wait") == [43, 2, 0]
        second = node.mig_create(H100, 19, 0)
        assert ask(watcher, "list") == [[uuid, 2, 0], [second, 7, 0]]
        node.mig_destroy(H100, 2)
        assert ask(watcher, "list") == [[second, 7, 0]]
    assert node.mig_instances(H100) == [
        {"gi_id": 7, "ci_id": 0, "gi_profile_id": 19, "start": 0, "size": 1, "uuid": second,
         "profile": "1g.10gb"},
    ]  # fmt: skip


def test_refusals_reach_the_caller_with_nvml_code(tmp_path: Path) -> None:
    node = NodeSim("h100-mig-dynamic", tmp_path / "state")
    node.mig_create(H100, 20, 0)
    with pytest.raises(MigError, match="Insufficient resources") as err:
        node.mig_create(H100, 20, 3)  # a second 1g.10gb+me
    assert err.value.code == INSUFFICIENT_RESOURCES
    with pytest.raises(MigError) as err:
        node.mig_create(H100, 9, 2)
    assert err.value.code == INVALID_ARGUMENT
    with pytest.raises(ValueError, match="not a MIG-capable GPU"):
        node.mig_create("GPU-00000000-0000-0000-0000-000000000000", 19, 0)


def test_static_layout_can_be_destroyed_and_a_reboot_restores_it(tmp_path: Path) -> None:
    node = NodeSim("h100-mig-single", tmp_path / "state")
    gpu = node.inventory.gpus[0]
    static = [(m.gi_id, m.ci_id, m.uuid) for m in gpu.mig_devices]
    assert [(m["gi_id"], m["ci_id"], m["uuid"]) for m in node.mig_instances(gpu.uuid)] == static
    node.mig_destroy(gpu.uuid, static[0][0])
    made = node.mig_create(gpu.uuid, 19, 0)  # the freed slice, with a new UUID
    assert made not in [uuid for _, _, uuid in static]
    with pytest.raises(MigError, match="destroy them before changing MIG mode"):
        node.set_mig_mode(gpu.uuid, False)
    node.reboot()
    assert [(m["gi_id"], m["ci_id"], m["uuid"]) for m in node.mig_instances(gpu.uuid)] == static


def test_mig_mode_turned_on_lets_instances_be_made(tmp_path: Path) -> None:
    node = NodeSim("h100-mig-empty", tmp_path / "state")
    off = node.inventory.gpus[1].uuid
    with pytest.raises(MigError) as err:
        node.mig_create(off, 19, 0)
    assert err.value.code == NOT_SUPPORTED
    node.set_mig_mode(off, True)
    uuid = node.mig_create(off, 0, 0)
    assert [m["profile"] for m in node.mig_instances(off)] == ["7g.80gb"]
    node.reboot()  # instances are gone; MIG mode stays on
    assert node.mig_instances(off) == []
    node.mig_create(off, 0, 0)
    assert uuid not in [m["uuid"] for m in node.mig_instances(off)]


def test_discovery_reads_a_made_instance(tmp_path: Path) -> None:
    node = NodeSim("a100-80gb-mig-dynamic", tmp_path / "state")
    gpu = node.inventory.gpus[0].uuid
    uuid = node.mig_create(gpu, 15, 6)  # 1g.20gb on the last two memory slices
    code = "from nvdp.inventory.nvml import discover; print(repr(discover().gpus[0].mig_devices))"
    done = subprocess.run([sys.executable, "-c", code], env=python_env(node.env), capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"uuid='{uuid}'" in done.stdout
    assert "profile='1g.20gb', gi_id=6, ci_id=0, memory_bytes=21072183296" in done.stdout
    assert "gi_profile_id=15, placement_start=6, placement_size=2" in done.stdout


def test_cli_makes_and_lists_instances(tmp_path: Path) -> None:
    state = tmp_path / "state"
    base = [sys.executable, "-m", "sim.nvml"]
    args = ["--state-dir", str(state), "--profile", "h100-mig-dynamic", "--uuid", H100]

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *command], cwd=REPO_ROOT, env=python_env({}), capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip

    made = run("mig-create", *args, "--gi-profile", "14", "--start", "2")
    assert made.returncode == 0, made.stderr
    listed = run("mig-instances", *args)
    assert [(m["uuid"], m["gi_id"], m["start"]) for m in json.loads(listed.stdout)] == [
        (made.stdout.strip(), 4, 2)
    ]
    refused = run("mig-create", *args, "--gi-profile", "14", "--start", "2")
    assert refused.returncode == 1 and "Insufficient resources" in refused.stderr
    assert run("reboot", "--state-dir", str(state)).returncode == 0
    assert json.loads(run("mig-instances", *args).stdout) == []


def test_concurrent_creations_in_several_processes_lose_nothing(tmp_path: Path) -> None:
    """Eight processes each make a 1g.10gb at the first free placement at once: the file lock lets seven
    have a placement each and refuses the eighth, as the GPU has seven."""
    node = NodeSim("h100-mig-dynamic", tmp_path / "state")
    code = PRELUDE + """
h = n.nvmlDeviceGetHandleByIndex(0)
try:
    print(gi_info(n.nvmlDeviceCreateGpuInstance(h, 19))[2])
except n.NVMLError as e:
    print(f"error {e.value}")
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], env=python_env(node.env), stdout=subprocess.PIPE,
                              text=True) for _ in range(8)]  # fmt: skip
    answers = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert answers == ["0", "1", "2", "3", "4", "5", "6", f"error {INSUFFICIENT_RESOURCES}"]
    starts = [m["start"] for m in node.mig_instances(H100)]
    assert sorted(starts) == list(range(7))
