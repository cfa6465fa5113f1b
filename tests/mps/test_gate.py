"""The plugin's MPS gate: waits with a hint, serves once ready, reports readiness changes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.mps import control
from nvdp.mps.paths import ResourcePaths
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
        {"MPS_CONTAINER_ROOT": str(mps_root), "NODE_NAME": "n1", "MPS_WAIT_LOG_INTERVAL": "0.5"},
    )
    assert (g.paths.root, g.node_name, g.interval_s, g.probe_interval_s) == (mps_root, "n1", 0.5, 5.0)
    default = MpsGate.from_env("nvidia.com/gpu", LOG, {"MPS_WAIT_LOG_INTERVAL": "soon"})
    assert (default.paths.root, default.node_name, default.interval_s) == (Path("/mps"), "<node name>", 30.0)
