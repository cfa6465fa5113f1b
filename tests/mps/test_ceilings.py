"""The MPS server's ceilings bind every client; a client's own CUDA_MPS_* variables only lower them.

On the stand-in nvidia-cuda-mps-control, which plays MPS servers as measured on an H100: a server copies
the daemon's defaults when its first client connects, and later defaults do not reach it. So the
ceilings must be sent before the daemon is marked ready, in device-plugin mode (the replica share) and in
DRA mode (the largest limit among the claims on the GPU set, raised and lowered as claims come and go).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.daemon.report.recording import Recorder
from nvdp.dra.claims.sharing.mps import ClaimMps, client_env, daemon_name
from nvdp.dra.claims.sharing.mps_limits import LIMITS_FILE, ClaimLimits, read_limits
from nvdp.mps.commands import Ceiling
from nvdp.mps.daemons import plan_mps
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.supervisor import Backoff, ResourceDaemon, unexpected
from sim.mps import connect_client, read_record, recorded_servers

from .fakes import FakeModes
from .nodes import gpu, inventory, mps_config
from .ordered_runner import carried_out
from .waiting import wait_for

pytestmark = pytest.mark.slow
LOG = logging.getLogger("test.mps.ceilings")
DRIVER = "gpu.nvidia.com"
G0 = gpu(0).uuid
GREEDY = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=15360M"}


def before_ready(record: Path) -> list[str]:
    """The commands the daemon got before its first probe (which precedes the ready marker)."""
    commands = [e["command"] for e in read_record(record) if e["event"] == "command"]
    return commands[:commands.index("get_default_active_thread_percentage")]


def limits(answer: dict[str, object]) -> tuple[object, object]:
    return answer["thread_percentage"], answer["memory_mib"]


# --- device-plugin mode -------------------------------------------------------------------------------


def test_the_replica_share_binds_a_client_that_asks_for_the_whole_gpu(mps_root: Path, record: Path) -> None:
    (settings,) = plan_mps(mps_config(10), inventory(gpu(0)))
    daemon = ResourceDaemon(settings, ResourcePaths(mps_root, "nvidia.com/gpu"), FakeModes(), LOG,
                            probe_interval_s=0.05, backoff=Backoff(0.05, 0.2), recorder=Recorder())
    daemon.start()
    try:
        assert wait_for(daemon.paths.ready_marker.exists)
        assert before_ready(record) == ["set_default_active_thread_percentage 10",
                                        "set_default_device_pinned_mem_limit 0 1536M"]
        assert limits(connect_client(daemon.paths.pipe_dir, GREEDY)) == (10.0, {"0": 1536})
        lower = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "5", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=512M"}
        assert limits(connect_client(daemon.paths.pipe_dir, lower)) == (5.0, {"0": 512})
    finally:
        daemon.stop()


# --- DRA mode: one daemon per GPU set, its ceiling from the claims ------------------------------------


@pytest.fixture
def claims(mps_root: Path, record: Path) -> Iterator[ClaimMps]:
    manager = ClaimMps(root=mps_root, host_root="/run/nvidia/mps", driver=DRIVER,
                       inventory=inventory(gpu(0), gpu(1)), log=LOG, ready_wait_s=10, poll_s=0.01)
    with carried_out(mps_root, FakeModes, driver=DRIVER):
        yield manager


def pipe(mps_root: Path) -> Path:
    return mps_root / daemon_name(DRIVER, [G0]) / "pipe"


def claim_env(threads: int, mib: int) -> dict[str, str]:
    """What a claim's CDI spec gives its containers."""
    return client_env(threads, [mib])


QUARTER = ClaimLimits(thread_percentage=25, memory_mib=((G0, 3840),))
HALF = ClaimLimits(thread_percentage=50, memory_mib=((G0, 7680),))


def test_the_first_claims_limits_are_the_ceiling_before_any_client(claims: ClaimMps, mps_root: Path,
                                                                  record: Path) -> None:
    claims.use("claim-1", [G0], QUARTER)
    assert before_ready(record) == ["set_default_active_thread_percentage 25",
                                    "set_default_device_pinned_mem_limit 0 3840M"]
    # A container that rewrote its environment to ask for the whole GPU is still held to its claim.
    assert limits(connect_client(pipe(mps_root), GREEDY)) == (25.0, {"0": 3840})
    assert limits(connect_client(pipe(mps_root), {})) == (25.0, {"0": 3840})
    (server,) = recorded_servers(record)
    assert server["ceilings"] == {"thread_percentage": 25.0, "memory_mib": {"0": 3840}}


def test_a_larger_claim_raises_the_ceiling_and_its_leaving_lowers_it(claims: ClaimMps, mps_root: Path,
                                                                     record: Path) -> None:
    claims.use("small", [G0], QUARTER)
    # Its first client starts the server, with the ceiling of then.
    assert limits(connect_client(pipe(mps_root), claim_env(25, 3840))) == (25.0, {"0": 3840})
    claims.use("large", [G0], HALF)
    settings = claims.settings([G0])
    assert settings is not None and settings.ceiling == Ceiling(50, (7680,))
    first, *_, last = recorded_servers(record)  # the running server, given the new ceiling
    assert (last["server"], last["ceilings"]) == (first["server"], {"thread_percentage": 50.0,
                                                                    "memory_mib": {"0": 7680}})
    # The large claim's clients get its limits; the small claim's stay below by their environment.
    assert limits(connect_client(pipe(mps_root), claim_env(50, 7680))) == (50.0, {"0": 7680})
    assert limits(connect_client(pipe(mps_root), claim_env(25, 3840))) == (25.0, {"0": 3840})
    # ... which is advisory: with it rewritten, a small claim's client reaches the ceiling, not further.
    assert limits(connect_client(pipe(mps_root), GREEDY)) == (50.0, {"0": 7680})
    written = read_limits(mps_root / daemon_name(DRIVER, [G0]) / LIMITS_FILE)
    assert written is not None and written.ceiling == Ceiling(50, (7680,))
    assert written.claims == {"small": QUARTER, "large": HALF}

    claims.release("large")  # the order is lowered; the MPS image retunes the daemon shortly after
    assert wait_for(lambda: limits(connect_client(pipe(mps_root), GREEDY)) == (25.0, {"0": 3840}))
    written = read_limits(mps_root / daemon_name(DRIVER, [G0]) / LIMITS_FILE)
    assert written is not None and written.claims == {"small": QUARTER}
    claims.release("small")
    assert not (mps_root / daemon_name(DRIVER, [G0]) / LIMITS_FILE).exists()
    claims.use("again", [G0], QUARTER)
    claims.stop()  # the plugin's shut-down: the daemon serves on, and nvdp doctor still shows its limits
    assert (mps_root / daemon_name(DRIVER, [G0]) / LIMITS_FILE).exists()
    assert ResourcePaths(mps_root, daemon_name(DRIVER, [G0])).ready_marker.exists()


def test_a_smaller_claim_joins_without_changing_the_ceiling(claims: ClaimMps, record: Path) -> None:
    claims.use("large", [G0], HALF)
    sent = len(read_record(record))
    claims.use("small", [G0], QUARTER)
    commands = [e["command"] for e in read_record(record)[sent:] if e["event"] == "command"]
    assert not [c for c in commands if c.startswith("set_")]


def test_adopted_claims_start_their_daemon_with_the_largest_of_their_limits(claims: ClaimMps,
                                                                            mps_root: Path,
                                                                            record: Path) -> None:
    # After a plugin restart the claims come back one by one; the daemon may be up before the second.
    claims.adopt("small", [G0], QUARTER)
    claims.adopt("large", [G0], HALF)
    paths = ResourcePaths(mps_root, daemon_name(DRIVER, [G0]))
    assert wait_for(paths.ready_marker.exists)
    assert limits(connect_client(paths.pipe_dir, GREEDY)) == (50.0, {"0": 7680})


def test_a_claim_without_limits_leaves_the_whole_gpu(claims: ClaimMps, mps_root: Path, record: Path) -> None:
    claims.use("whole", [G0])
    assert before_ready(record) == ["set_default_active_thread_percentage 100"]
    assert limits(connect_client(pipe(mps_root), {})) == (100.0, {})


def test_the_daemons_echo_of_a_percentage_is_no_complaint() -> None:
    # The real daemon (driver 580, H100) answers set_(default_)active_thread_percentage with the value.
    assert unexpected("25.0\n50.0") == ""
    assert unexpected("50.0\nInvalid arguments: x 1G") == "Invalid arguments: x 1G"


def test_the_hardware_check_runs_on_the_stand_in(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "mps_ceiling_check.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "--sim"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["raise"] == "ok" and report["dra_stop_restored"] and report["dp_stop_restored"]
    answers = {s["step"]: s["answer"] for s in report["steps"]}
    greedy = [v for k, v in answers.items() if k.startswith("dra") and "whole GPU" in k]
    assert [(a["thread_percentage"], a["memory_mib"]) for a in greedy] == [
        (25.0, {"0": 8192}), (50.0, {"0": 16384}), (25.0, {"0": 8192})]
