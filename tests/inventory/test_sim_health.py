"""The stand-in NVML's GPU health state, read through the real pynvml in another process: pending page
retirement and row remapping, ECC counts, the recovery action, unanswering and lost GPUs, and a GPU reset."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.nvml import PROFILES_DIR, NodeSim

from .conftest import line_process

pytestmark = pytest.mark.slow  # starts processes

# A long-lived process that answers one JSON line per command line, so a test can change the state between
# calls and see the same process (one nvmlInit) read the change:
#   read <uuid>       identity, memory and every health reading of a GPU or MIG device
#   register          registers every GPU for XID events; each GPU's result
#   wait <ms>         the next event, with the memory reading of its device
#   ecc <type> <ctr>  nvmlDeviceGetTotalEccErrors of GPU 0 with raw error and counter types
#   gi <uuid> <gi>    nvmlGpuInstanceGetInfo's profile id, with a GPU instance handle taken at first ask
PROBE = """
import json, sys
import pynvml as n

def call(f):
    try:
        return f()
    except n.NVMLError as e:
        return f"error {e.value}"

def fields(h):
    asked = [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, (n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 5)]
    names = ("fieldId", "scopeId", "timestamp", "latencyUsec", "valueType", "nvmlReturn")
    return [{**{k: getattr(v, k) for k in names}, "value": v.value.uiVal}
            for v in n.nvmlDeviceGetFieldValues(h, asked)]

def read(uuid):
    h = n.nvmlDeviceGetHandleByUUID(uuid)
    return {
        "uuid": call(lambda: n.nvmlDeviceGetUUID(h)),
        "name": call(lambda: n.nvmlDeviceGetName(h)),
        "index": call(lambda: n.nvmlDeviceGetIndex(h)),
        "minor": call(lambda: n.nvmlDeviceGetMinorNumber(h)),
        "bus_id": call(lambda: n.nvmlDeviceGetPciInfo(h).busId),
        "memory": call(lambda: n.nvmlDeviceGetMemoryInfo(h).total),
        "retired_pending": call(lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "remapped_rows": call(lambda: list(n.nvmlDeviceGetRemappedRows(h))),
        "ecc_volatile": call(lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)),
        "ecc_aggregate": call(lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC)),
        "ecc_corrected": call(lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC)),
        "fields": call(lambda: fields(h)),
    }

n.nvmlInit()
events = n.nvmlEventSetCreate()
instances = {}
print("READY", flush=True)
for line in sys.stdin:
    command, *args = line.split()
    if command == "read":
        answer = read(args[0])
    elif command == "register":
        answer = {}
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            answer[n.nvmlDeviceGetUUID(h)] = call(lambda: n.nvmlDeviceRegisterEvents(
                h, n.nvmlEventTypeXidCriticalError, events) or "ok")
    elif command == "wait":
        try:
            e = n.nvmlEventSetWait_v2(events, int(args[0]))
            answer = {"uuid": n.nvmlDeviceGetUUID(e.device), "xid": e.eventData,
                      "memory": call(lambda: n.nvmlDeviceGetMemoryInfo(e.device).total)}
        except n.NVMLError as err:
            answer = f"error {err.value}"
    elif command == "ecc":
        h = n.nvmlDeviceGetHandleByIndex(0)
        answer = call(lambda: n.nvmlDeviceGetTotalEccErrors(h, int(args[0]), int(args[1])))
    elif command == "gi":
        if tuple(args) not in instances:
            gpu = n.nvmlDeviceGetHandleByUUID(args[0])
            instances[tuple(args)] = n.nvmlDeviceGetGpuInstanceById(gpu, int(args[1]))
        answer = call(lambda: n.nvmlGpuInstanceGetInfo(instances[tuple(args)]).profileId)
    print(json.dumps(answer), flush=True)
"""

NOT_SUPPORTED = "error 3"
INVALID_ARGUMENT = "error 2"
TIMEOUT = "error 10"
GPU_IS_LOST = "error 15"
UNKNOWN = "error 999"
HEALTH_CALLS = (
    "retired_pending",
    "remapped_rows",
    "ecc_volatile",
    "ecc_aggregate",
    "ecc_corrected",
    "fields",
)
IDENTITY_CALLS = ("uuid", "name", "index", "minor", "bus_id")


class Probe:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def ask(self, line: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{line}\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the probe process died"
        return json.loads(answer)

    def read(self, uuid: str) -> dict[str, Any]:
        answer = self.ask(f"read {uuid}")
        assert isinstance(answer, dict)
        return answer

    def health(self, uuid: str) -> dict[str, Any]:
        """The health readings only, the recovery action field reduced to its (nvmlReturn, value)."""
        answer = self.read(uuid)
        result = {key: answer[key] for key in HEALTH_CALLS}
        if isinstance(answer["fields"], list):
            result["fields"] = (answer["fields"][0]["nvmlReturn"], answer["fields"][0]["value"])
        return result


@contextmanager
def probe(node: NodeSim) -> Iterator[Probe]:
    with line_process(node, PROBE) as proc:
        yield Probe(proc)


def one_gpu_profile(tmp_path: Path, name: str, **fields: str) -> Path:
    """The t4 profile with its GPU's name, compute capability or architecture replaced."""
    document = yaml.safe_load((PROFILES_DIR / "t4.yaml").read_text())
    document["gpus"][0].update(name=name, **fields)
    path = tmp_path / f"{name.replace(' ', '-')}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


# Readings of a healthy GPU: page retirement up to Turing, row remapping from Ampere on.
RETIRES = {"retired_pending": 0, "remapped_rows": NOT_SUPPORTED}
REMAPS = {"retired_pending": NOT_SUPPORTED, "remapped_rows": [0, 0, 0, 0]}
NEITHER = {"retired_pending": NOT_SUPPORTED, "remapped_rows": NOT_SUPPORTED}
CLEAN = {"ecc_volatile": 0, "ecc_aggregate": 0, "ecc_corrected": 0, "fields": (0, 0)}


@pytest.mark.parametrize(
    ("profile", "gpu", "expected"),
    [
        ("t4", 0, RETIRES),  # Turing
        ("mixed-4", 2, RETIRES),  # Volta (V100)
        ("a100-sxm-8", 0, REMAPS),  # Ampere
        ("h100-mig-8", 1, REMAPS),  # Hopper
        ("gb200-nvl-4", 0, REMAPS),  # Blackwell (CC 10.0)
        ("rtx-pro-6000-mig-me", 0, REMAPS),  # Blackwell (CC 12.0)
        ("Tesla K80", 0, RETIRES),
        ("Tesla P100", 0, RETIRES),
        ("NVIDIA L4", 0, REMAPS),
        ("Mystery GPU", 0, NEITHER),
    ],
)
def test_support_follows_the_architecture(
    profile: str, gpu: int, expected: dict[str, Any], tmp_path: Path, make_node: Callable[[str], NodeSim]
) -> None:
    made = {
        "Tesla K80": {"compute_capability": "3.7"},
        "Tesla P100": {"compute_capability": "6.0"},
        "NVIDIA L4": {"compute_capability": "8.9"},
        "Mystery GPU": {"architecture": "Unknown"},
    }
    if profile in made:
        node = NodeSim(one_gpu_profile(tmp_path, profile, **made[profile]), tmp_path / "state")
    else:
        node = make_node(profile)
    with probe(node) as p:
        assert p.health(node.inventory.gpus[gpu].uuid) == {**expected, **CLEAN}


def test_each_call_reads_the_state_at_each_call(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("mixed-4")
    turing, volta = node.inventory.gpus[0], node.inventory.gpus[2]
    hopper_node = make_node("h100-mig-8")
    hopper = hopper_node.inventory.gpus[0].uuid
    with probe(node) as p, probe(hopper_node) as q:
        node.pending_retirement(turing.uuid)
        assert p.health(turing.uuid)["retired_pending"] == 1
        assert p.health(volta.uuid)["retired_pending"] == 0  # only the GPU named
        node.pending_retirement(turing.uuid, on=False)
        assert p.health(turing.uuid)["retired_pending"] == 0

        hopper_node.pending_remap(hopper)
        assert q.health(hopper)["remapped_rows"] == [0, 0, 1, 0]
        hopper_node.remap_failure(hopper)
        assert q.health(hopper)["remapped_rows"] == [0, 0, 1, 1]
        hopper_node.pending_remap(hopper, on=False)
        assert q.health(hopper)["remapped_rows"] == [0, 0, 0, 1]
        hopper_node.remap_failure(hopper, on=False)
        assert q.health(hopper)["remapped_rows"] == [0, 0, 0, 0]

        node.ecc_errors(volta.uuid, 3, aggregate=11)
        assert {k: p.health(volta.uuid)[k] for k in ("ecc_volatile", "ecc_aggregate", "ecc_corrected")} == {
            "ecc_volatile": 3,
            "ecc_aggregate": 11,
            "ecc_corrected": 0,
        }
        for action in (1, 7, 2, 0):
            node.recovery_action(volta.uuid, action)
            assert p.health(volta.uuid)["fields"] == (0, action)
        assert p.health(turing.uuid) == {**RETIRES, **CLEAN}


def test_ecc_aggregate_grows_with_the_volatile_count(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("a100-sxm-8")
    uuid = node.inventory.gpus[3].uuid
    counts = []
    with probe(node) as p:
        for volatile, aggregate in ((3, None), (5, None), (1, None), (4, None), (2, 40), (6, None)):
            node.ecc_errors(uuid, volatile, aggregate)
            reading = p.health(uuid)
            counts.append((reading["ecc_volatile"], reading["ecc_aggregate"]))
    assert counts == [(3, 3), (5, 5), (1, 5), (4, 8), (2, 40), (6, 44)]


def test_field_values_layout(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("gb200-nvl-4")
    uuid = node.inventory.gpus[2].uuid
    node.recovery_action(uuid, 5)  # NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN
    before = time.time() * 1e6
    with probe(node) as p:
        fields = p.read(uuid)["fields"]
    after = time.time() * 1e6
    recovery, other = fields
    assert before - 1e6 <= recovery["timestamp"] <= after + 1e6
    assert recovery == {
        "fieldId": 230,
        "scopeId": 0,
        "timestamp": recovery["timestamp"],
        "latencyUsec": 0,
        "valueType": 1,  # NVML_VALUE_TYPE_UNSIGNED_INT
        "nvmlReturn": 0,
        "value": 5,
    }
    # An unsupported field fails in its own nvmlReturn; the ids the caller gave are kept.
    assert {k: other[k] for k in ("fieldId", "scopeId", "nvmlReturn")} == {
        "fieldId": 4,
        "scopeId": 5,
        "nvmlReturn": 3,
    }


def test_ecc_argument_checks(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("t4")
    node.ecc_errors(node.inventory.gpus[0].uuid, 2, aggregate=9)
    with probe(node) as p:
        assert [p.ask(f"ecc {t} {c}") for t, c in ((1, 0), (1, 1), (0, 0), (0, 1))] == [2, 9, 0, 0]
        assert [p.ask(f"ecc {t} {c}") for t, c in ((2, 0), (1, 2))] == [INVALID_ARGUMENT, INVALID_ARGUMENT]


def test_mig_devices_leave_memory_health_to_their_gpu(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("h100-mig-8")
    gpu = node.inventory.gpus[0]
    mig = gpu.mig_devices[0]
    node.pending_remap(gpu.uuid)
    node.ecc_errors(gpu.uuid, 4)
    node.recovery_action(gpu.uuid, 1)
    with probe(node) as p:
        assert p.health(mig.uuid) == {
            "retired_pending": NOT_SUPPORTED,
            "remapped_rows": NOT_SUPPORTED,
            "ecc_volatile": NOT_SUPPORTED,
            "ecc_aggregate": NOT_SUPPORTED,
            "ecc_corrected": NOT_SUPPORTED,
            "fields": (3, 0),  # the call succeeds, the field is not supported on a MIG handle
        }
        assert p.health(gpu.uuid) == {**REMAPS, "remapped_rows": [0, 0, 1, 0], "ecc_volatile": 4,
                                      "ecc_aggregate": 4, "ecc_corrected": 0, "fields": (0, 1)}  # fmt: skip


@pytest.mark.parametrize("profile", ["t4", "h100-mig-8"])
def test_reset_gpu_clears_everything_but_the_aggregate_count(
    profile: str, make_node: Callable[[str], NodeSim]
) -> None:
    node = make_node(profile)
    uuid = node.inventory.gpus[0].uuid
    expected = RETIRES if profile == "t4" else REMAPS
    with probe(node) as p:
        node.pending_retirement(uuid)
        node.pending_remap(uuid)
        node.remap_failure(uuid)
        node.ecc_errors(uuid, 6)
        node.ecc_errors(uuid, 2)
        node.recovery_action(uuid, 4)
        faulty = p.health(uuid)
        assert faulty["ecc_volatile"] == 2 and faulty["ecc_aggregate"] == 6 and faulty["fields"] == (0, 4)
        assert faulty["retired_pending" if profile == "t4" else "remapped_rows"] in (1, [0, 0, 1, 1])
        node.unanswering(uuid)
        node.lose_gpu(uuid)
        assert p.read(uuid)["memory"] == GPU_IS_LOST

        node.reset_gpu(uuid)
        assert p.read(uuid)["memory"] == node.inventory.gpus[0].memory_bytes
        assert p.health(uuid) == {**expected, **CLEAN, "ecc_aggregate": 6}
    for folder in (
        "lost",
        "unanswering",
        "retired-pending",
        "remap-pending",
        "remap-failed",
        "recovery-action",
    ):
        assert not (node.state_dir / folder / uuid).exists(), folder
    assert (node.state_dir / "ecc-volatile" / uuid).read_text().strip() == "0"


def test_reset_gpu_touches_only_its_gpu(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("a100-sxm-8")
    first, second = (g.uuid for g in node.inventory.gpus[:2])
    for uuid in (first, second):
        node.pending_remap(uuid)
        node.ecc_errors(uuid, 1)
        node.unanswering(uuid)
    node.reset_gpu(first)
    with probe(node) as p:
        assert p.health(first) == {**REMAPS, **CLEAN, "ecc_aggregate": 1}
        assert p.health(second) == dict.fromkeys(HEALTH_CALLS, UNKNOWN)
        node.unanswering(second, on=False)
        assert p.health(second)["remapped_rows"] == [0, 0, 1, 0]


def test_unanswering_is_not_lost(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("h100-mig-8")
    gpu, other = node.inventory.gpus[4], node.inventory.gpus[5]
    mig = gpu.mig_devices[1]
    with probe(node) as p:
        healthy = p.read(gpu.uuid)
        healthy_mig = p.read(mig.uuid)
        assert p.ask(f"gi {gpu.uuid} {mig.gi_id}") == mig.gi_profile_id
        node.unanswering(gpu.uuid)
        assert p.ask(f"gi {gpu.uuid} {mig.gi_id}") == UNKNOWN  # a GPU instance handle taken before
        hung, hung_mig = p.read(gpu.uuid), p.read(mig.uuid)
        # Identity still answers, everything else is UNKNOWN, on the GPU and its MIG devices alike.
        assert {k: hung[k] for k in IDENTITY_CALLS} == {k: healthy[k] for k in IDENTITY_CALLS}
        assert {k: hung_mig[k] for k in IDENTITY_CALLS} == {k: healthy_mig[k] for k in IDENTITY_CALLS}
        for reading in (hung, hung_mig):
            assert {k: reading[k] for k in ("memory", *HEALTH_CALLS)} == dict.fromkeys(
                ("memory", *HEALTH_CALLS), UNKNOWN
            )
        assert p.read(other.uuid)["memory"] == other.memory_bytes

        node.lose_gpu(gpu.uuid)  # lost wins over unanswering
        assert p.read(gpu.uuid)["memory"] == GPU_IS_LOST
        assert p.read(mig.uuid)["remapped_rows"] == GPU_IS_LOST
        assert p.ask(f"gi {gpu.uuid} {mig.gi_id}") == GPU_IS_LOST
        node.unanswering(gpu.uuid, on=False)
        assert p.read(gpu.uuid)["memory"] == GPU_IS_LOST

        node.find_gpu(gpu.uuid)  # back on the bus: answers again
        assert p.read(gpu.uuid)["memory"] == gpu.memory_bytes
        assert p.read(mig.uuid)["memory"] == mig.memory_bytes
        assert p.ask(f"gi {gpu.uuid} {mig.gi_id}") == mig.gi_profile_id
        assert p.health(gpu.uuid) == {**REMAPS, **CLEAN}


def test_find_gpu_keeps_the_other_health_state(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("a100-sxm-8")
    uuid = node.inventory.gpus[6].uuid
    node.pending_remap(uuid)
    node.unanswering(uuid)
    node.lose_gpu(uuid)
    node.find_gpu(uuid)
    with probe(node) as p:
        assert p.read(uuid)["memory"] == UNKNOWN  # still not answering: find_gpu only ends `lost`
        node.unanswering(uuid, on=False)
        assert p.health(uuid)["remapped_rows"] == [0, 0, 1, 0]


def test_events_keep_coming_while_a_gpu_is_unanswering(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("mixed-4")
    hung, fine, late = (g.uuid for g in node.inventory.gpus[:3])
    node.unanswering(late)  # before registration: its registration fails, the others' do not
    with probe(node) as p:
        assert p.ask("register") == {**{g.uuid: "ok" for g in node.inventory.gpus}, late: UNKNOWN}
        node.unanswering(hung)
        node.inject_xid(fine, 48)
        node.inject_xid(hung, 94)
        node.inject_xid(late, 31)  # never registered: not delivered
        node.inject_xid(fine, 63)
        assert p.ask("wait 5000") == {"uuid": fine, "xid": 48, "memory": 15360 * 1024 * 1024}
        assert p.ask("wait 5000") == {"uuid": hung, "xid": 94, "memory": UNKNOWN}
        assert p.ask("wait 5000") == {"uuid": fine, "xid": 63, "memory": 15360 * 1024 * 1024}
        assert p.ask("wait 50") == TIMEOUT


def test_writes_replace_files_whole(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("t4")
    uuid = node.inventory.gpus[0].uuid
    node.ecc_errors(uuid, 1)
    node.recovery_action(uuid, 1)
    with (
        (node.state_dir / "ecc-volatile" / uuid).open() as ecc,
        (node.state_dir / "recovery-action" / uuid).open() as act,
    ):
        node.ecc_errors(uuid, 2)
        node.recovery_action(uuid, 6)
        # A rename put new files in place; an open reader keeps the old whole file.
        assert (ecc.read(), act.read()) == ("1\n", "1\n")
    assert (node.state_dir / "ecc-volatile" / uuid).read_text() == "2\n"
    assert (node.state_dir / "recovery-action" / uuid).read_text() == "6\n"
    leftovers = [p.name for p in node.state_dir.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_node_sim_checks_what_it_is_given(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("h100-mig-8")
    gpu = node.inventory.gpus[0].uuid
    mig = node.inventory.gpus[0].mig_devices[0].uuid
    for call in (
        "pending_retirement",
        "pending_remap",
        "remap_failure",
        "unanswering",
        "find_gpu",
        "reset_gpu",
    ):
        with pytest.raises(ValueError, match="is not a GPU or MIG device"):
            getattr(node, call)("GPU-nope")
        with pytest.raises(ValueError) as err:
            getattr(node, call)(mig)
        assert (
            str(err.value) == f"{mig} is a MIG device; {call} takes a GPU's UUID (its MIG devices follow it)"
        )
    with pytest.raises(ValueError, match="is a MIG device"):
        node.ecc_errors(mig, 1)
    with pytest.raises(ValueError, match="cannot be negative"):
        node.ecc_errors(gpu, -1)
    with pytest.raises(ValueError, match="cannot be negative"):
        node.ecc_errors(gpu, 1, aggregate=-2)
    with pytest.raises(ValueError, match=r"recovery action 8 is not an NVML_GPU_RECOVERY_ACTION_\* value"):
        node.recovery_action(gpu, 8)
    assert not any(
        (node.state_dir / f).exists() for f in ("ecc-volatile", "ecc-aggregate", "recovery-action")
    )


def test_cli_drives_a_running_process(make_node: Callable[[str], NodeSim]) -> None:
    node = make_node("a100-sxm-8")
    uuid = node.inventory.gpus[1].uuid

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [
            sys.executable,
            "-m",
            "sim.nvml",
            args[0],
            "--state-dir",
            str(node.state_dir),
            "--uuid",
            uuid,
        ]
        return subprocess.run([*command, *args[1:]], cwd=str(node.library.parents[2]), capture_output=True,
                              text=True, check=False)  # fmt: skip

    with probe(node) as p:
        for args in (("pending-remap",), ("remap-failure",), ("ecc-errors", "--volatile", "3"),
                     ("recovery-action", "--action", "2"), ("pending-retirement",)):  # fmt: skip
            assert cli(*args).returncode == 0
        faulty = {"remapped_rows": [0, 0, 1, 1], "ecc_volatile": 3, "ecc_aggregate": 3, "fields": (0, 2)}
        assert p.health(uuid) == {**REMAPS, **CLEAN, **faulty}
        assert (node.state_dir / "retired-pending" / uuid).exists()  # set, though an A100 does not report it
        assert cli("remap-failure", "--off").returncode == 0
        assert p.health(uuid)["remapped_rows"] == [0, 0, 1, 0]
        assert cli("ecc-errors", "--volatile", "1", "--aggregate", "9").returncode == 0
        assert (p.health(uuid)["ecc_volatile"], p.health(uuid)["ecc_aggregate"]) == (1, 9)

        assert cli("unanswering").returncode == 0
        assert p.read(uuid)["memory"] == UNKNOWN
        assert cli("lose-gpu").returncode == 0
        assert p.read(uuid)["memory"] == GPU_IS_LOST
        assert cli("find-gpu").returncode == 0
        assert p.read(uuid)["memory"] == UNKNOWN
        assert cli("unanswering", "--off").returncode == 0
        assert p.read(uuid)["memory"] == 40960 * 1024 * 1024

        assert cli("reset-gpu").returncode == 0
        assert p.health(uuid) == {**REMAPS, **CLEAN, "ecc_aggregate": 9}
        assert not (node.state_dir / "retired-pending" / uuid).exists()

    refused = cli("recovery-action", "--action", "8")
    assert refused.returncode == 2 and "invalid choice" in refused.stderr
    refused = cli("ecc-errors", "--volatile", "-1")
    assert refused.returncode == 2 and "ECC error counts cannot be negative" in refused.stderr
