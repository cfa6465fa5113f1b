"""The plugin's MPS gate: waits with a hint, serves once ready, reports readiness changes."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.mps import control
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.status import State, read_status, write_status
from nvdp.plugin.mps_gate import MpsGate

from .waiting import wait_for

LOG = logging.getLogger("test.gate")


class FlakyProbe:
    """Answers or not, as the test says."""

    def __init__(self) -> None:
        self.answers = True
        self.calls: list[Path] = []

    def __call__(self, pipe_dir: Path) -> None:
        self.calls.append(pipe_dir)
        if not self.answers:
            raise control.MpsCommandError("nvidia-cuda-mps-control exited with status 1: no daemon")


@pytest.fixture
def probe() -> FlakyProbe:
    return FlakyProbe()


@pytest.fixture
def gate(mps_root: Path, probe: FlakyProbe) -> Iterator[MpsGate]:
    g = MpsGate(
        "nvidia.com/gpu", mps_root, "gpu-node", LOG, interval_s=0.05, probe=probe, probe_interval_s=0.02
    )
    yield g
    g.close()


def mark_ready(root: Path) -> None:
    paths = ResourcePaths(root, "nvidia.com/gpu")
    paths.base.mkdir(parents=True, exist_ok=True)
    paths.ready_marker.write_text("1\n")


def test_hint_names_the_label_and_the_command(gate: MpsGate, mps_root: Path) -> None:
    assert not gate.is_ready()
    assert gate.problem() == (
        f"nvidia.com/gpu: waiting for the MPS control daemon: {mps_root}/nvidia.com/gpu/.ready does not "
        "exist, so the MPS daemon pod is not running on node gpu-node. The chart runs it only on nodes "
        "labelled nvidia.com/mps.capable=true; fix: kubectl label node gpu-node nvidia.com/mps.capable=true"
    )


def test_marker_without_an_answering_daemon(gate: MpsGate, mps_root: Path, probe: FlakyProbe) -> None:
    mark_ready(mps_root)
    probe.answers = False
    assert gate.problem() == (
        f"nvidia.com/gpu: waiting for the MPS control daemon: it does not answer at "
        f"{mps_root}/nvidia.com/gpu/pipe (nvidia-cuda-mps-control exited with status 1: no daemon); see "
        "the log of the MPS daemon pod on node gpu-node"
    )
    probe.answers = True
    assert gate.is_ready()
    assert probe.calls[-1] == mps_root / "nvidia.com" / "gpu" / "pipe"


def test_wait_logs_periodically_and_returns_when_ready(
    gate: MpsGate, mps_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.gate")
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(gate.wait_until_ready()))
    waiter.start()
    assert wait_for(lambda: sum("kubectl label node" in r.getMessage() for r in caplog.records) >= 2)
    assert not result
    mark_ready(mps_root)
    waiter.join(20)
    assert result == [True]
    assert caplog.records[-1].getMessage() == "nvidia.com/gpu: MPS control daemon is ready"


def test_wait_stops_when_asked(gate: MpsGate) -> None:
    stop = threading.Event()
    stop.set()
    assert gate.wait_until_ready(stop) is False


def test_watch_reports_flips(gate: MpsGate, mps_root: Path, probe: FlakyProbe) -> None:
    mark_ready(mps_root)
    changes: list[bool] = []
    gate.watch(changes.append)
    probe.answers = False
    assert wait_for(lambda: changes == [False])
    probe.answers = True
    assert wait_for(lambda: changes == [False, True])


def test_from_env(mps_root: Path) -> None:
    g = MpsGate.from_env(
        "nvidia.com/gpu",
        LOG,
        {
            "MPS_CONTAINER_ROOT": str(mps_root),
            "NODE_NAME": "n1",
            "MPS_WAIT_LOG_INTERVAL": "0.5",
            "MPS_ROOT": "/run/nvidia/mps",
        },
    )
    assert (g.paths.root, g.node_name, g.interval_s, g.probe_interval_s) == (mps_root, "n1", 0.5, 5.0)
    assert g.host_root == "/run/nvidia/mps"
    default = MpsGate.from_env("nvidia.com/gpu", LOG, {"MPS_WAIT_LOG_INTERVAL": "soon"})
    assert (default.paths.root, default.node_name, default.interval_s) == (Path("/mps"), "<node name>", 30.0)


def publish(root: Path, state: State, error: str | None = None, age_s: float = 0.0) -> None:
    paths = ResourcePaths(root, "nvidia.com/gpu")
    paths.base.mkdir(parents=True, exist_ok=True)
    write_status(paths.status_file, state, error)
    if age_s:
        data = json.loads(paths.status_file.read_text())
        data["updated"] -= age_s
        paths.status_file.write_text(json.dumps(data))


def test_a_failing_daemon_is_reported_with_its_last_error_not_the_label(
    gate: MpsGate, mps_root: Path
) -> None:
    publish(mps_root, "failing", "MPS control daemon did not start: nvidia-cuda-mps-control is not on PATH")
    assert gate.problem() == (
        "nvidia.com/gpu: waiting for the MPS control daemon: the MPS daemon pod on node gpu-node is running "
        "but failing; its last error: MPS control daemon did not start: nvidia-cuda-mps-control is not on "
        "PATH; see the log of the MPS daemon pod on node gpu-node"
    )


def test_a_starting_daemon_is_reported_as_starting(gate: MpsGate, mps_root: Path) -> None:
    publish(mps_root, "starting")
    assert gate.problem() == (
        "nvidia.com/gpu: waiting for the MPS control daemon: the MPS daemon pod on node gpu-node is "
        "starting the daemon"
    )


@pytest.mark.parametrize(
    ("state", "age_s", "seen"),
    [
        ("stopped", 0.0, "stopped at"),
        ("failing", 3600.0, "last reported at"),
        ("ready", 3600.0, "last reported at"),
    ],
)
def test_a_daemon_that_is_gone_gets_the_label_fix(
    gate: MpsGate, mps_root: Path, state: State, age_s: float, seen: str
) -> None:
    publish(mps_root, state, "old trouble" if state == "failing" else None, age_s=age_s)
    problem = gate.problem()
    assert problem is not None
    assert f".ready does not exist and the MPS daemon {seen} 20" in problem
    assert problem.endswith(
        "UTC, so the MPS daemon pod is not running on node gpu-node. The chart runs it only on nodes "
        "labelled nvidia.com/mps.capable=true; fix: kubectl label node gpu-node nvidia.com/mps.capable=true"
    )
    assert "old trouble" not in problem


def test_an_old_marker_without_a_daemon_says_when_the_daemon_was_last_seen(
    gate: MpsGate, mps_root: Path, probe: FlakyProbe
) -> None:
    mark_ready(mps_root)
    publish(mps_root, "ready", age_s=3600.0)
    probe.answers = False
    problem = gate.problem()
    assert problem is not None
    assert "it does not answer at " in problem
    assert "no daemon); the MPS daemon last reported at 20" in problem
    assert problem.endswith("see the log of the MPS daemon pod on node gpu-node")


def test_an_unusable_root_is_named_with_the_fix(probe: FlakyProbe) -> None:
    with tempfile.NamedTemporaryFile(prefix="mps", dir="/tmp") as in_the_way:
        root = Path(in_the_way.name) / "mps"
        gate = MpsGate("nvidia.com/gpu", root, "gpu-node", LOG, probe=probe, host_root="/run/nvidia/mps")
        assert gate.problem() == (
            f"nvidia.com/gpu: waiting for the MPS control daemon: the MPS root {root} (host path "
            f"/run/nvidia/mps) is unusable: {in_the_way.name} is a file, not a directory; fix: make it a "
            "writable directory on the node (move away the file in the way, or remount it read-write), "
            "or set flags.mpsRoot (chart value mps.root) to another directory"
        )
    assert probe.calls == []


def test_a_garbled_status_file_is_ignored(gate: MpsGate, mps_root: Path) -> None:
    paths = ResourcePaths(mps_root, "nvidia.com/gpu")
    paths.base.mkdir(parents=True)
    for garbage in ("", "{", '{"state": "dancing", "updated": 1}', '{"state": "failing"}', "[1]"):
        paths.status_file.write_text(garbage)
        assert read_status(paths.status_file) is None
        problem = gate.problem()
        assert problem is not None and problem.endswith("nvidia.com/mps.capable=true")
