"""One supervised daemon per resource, on the stand-in nvidia-cuda-mps-control."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.daemon.report.recording import Recorder
from nvdp.mps.daemons import plan_mps
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.status import DaemonStatus, read_status
from nvdp.mps.supervisor import Backoff, ResourceDaemon
from sim.mps import read_record, recorded_commands

from .fakes import FakeModes
from .nodes import gpu, inventory, mps_config
from .waiting import wait_for

pytestmark = pytest.mark.slow  # starts processes

UUID = "GPU-00000000-0000-0000-0000-000000000000"
NO_STATUS = DaemonStatus(state="stopped", error=None, updated=0.0)


def test_backoff_doubles_up_to_thirty_seconds() -> None:
    backoff = Backoff()
    assert [backoff.next() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    backoff.reset()
    assert backoff.next() == 1


@pytest.fixture
def daemon(mps_root: Path, record: Path) -> Iterator[ResourceDaemon]:
    (settings,) = plan_mps(mps_config(10), inventory(gpu(0)))
    d = ResourceDaemon(
        settings,
        ResourcePaths(mps_root, "nvidia.com/gpu"),
        FakeModes(),
        logging.getLogger("test.mps"),
        probe_interval_s=0.05,
        backoff=Backoff(first_s=0.05, max_s=0.2),
        recorder=Recorder(),
    )
    yield d
    d.stop()


def marker_pid(daemon: ResourceDaemon) -> str | None:
    try:
        return daemon.paths.ready_marker.read_text().strip()
    except FileNotFoundError:
        return None


def starts(record: Path) -> list[int]:
    return [e["pid"] for e in read_record(record) if e["event"] == "start"]


def test_start_sends_commands_then_marks_ready(
    daemon: ResourceDaemon, record: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.mps")
    daemon.start()
    assert wait_for(daemon.paths.ready_marker.exists)
    # The marker is written before the "ready" line is logged: wait for the line too.
    assert wait_for(lambda: any(r.getMessage().startswith("nvidia.com/gpu: ready (") for r in caplog.records))
    assert recorded_commands(record) == [
        "set_default_active_thread_percentage 10",
        "set_default_device_pinned_mem_limit 0 1536M",
        "get_default_active_thread_percentage",
    ]
    (start,) = [e for e in read_record(record) if e["event"] == "start"]
    assert start["env"] == {
        "CUDA_MPS_LOG_DIRECTORY": str(daemon.paths.log_dir),
        "CUDA_MPS_PIPE_DIRECTORY": str(daemon.paths.pipe_dir),
        "CUDA_VISIBLE_DEVICES": UUID,
    }
    assert daemon.paths.pipe_dir == Path(str(daemon.paths.root)) / "nvidia.com" / "gpu" / "pipe"
    assert isinstance(daemon.modes, FakeModes)
    assert daemon.modes.calls == [("EXCLUSIVE_PROCESS", [UUID])]
    messages = [r.getMessage() for r in caplog.records]
    assert f"nvidia.com/gpu: MPS control daemon started (pid {start['pid']}) on {UUID}" in messages
    assert f"nvidia.com/gpu: ready ({daemon.paths.ready_marker})" in messages
    # control.log is streamed into our log with the resource name in front.
    assert wait_for(
        lambda: any(
            m.startswith("[nvidia.com/gpu] [") and m.endswith("] Starting control daemon")
            for m in [r.getMessage() for r in caplog.records]
        )
    )


def test_stop_quits_restores_and_unmarks(daemon: ResourceDaemon, record: Path) -> None:
    daemon.start()
    assert wait_for(daemon.paths.ready_marker.exists)
    daemon.stop()
    assert recorded_commands(record)[-1] == "quit"
    assert read_record(record)[-1]["event"] == "exit"
    assert not daemon.paths.ready_marker.exists()
    assert not daemon.paths.control_socket.exists()
    assert isinstance(daemon.modes, FakeModes)
    assert daemon.modes.calls[-1] == ("DEFAULT", [UUID])


def test_killed_daemon_is_restarted(
    daemon: ResourceDaemon, record: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.mps")
    daemon.start()
    assert wait_for(daemon.paths.ready_marker.exists)
    (first,) = starts(record)
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: len(starts(record)) == 2)
    assert wait_for(lambda: marker_pid(daemon) == str(starts(record)[1]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        w.startswith(f"nvidia.com/gpu: MPS control daemon (pid {first}) ")
        and w.endswith("restarting it in 0.05s")
        for w in warnings
    ), warnings
    # The new daemon got its settings again.
    assert recorded_commands(record).count("set_default_active_thread_percentage 10") == 2


def test_start_failure_is_retried_with_growing_pauses(
    mps_root: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    caplog.set_level(logging.INFO, "test.mps")
    (settings,) = plan_mps(mps_config(10), inventory(gpu(0)))
    d = ResourceDaemon(
        settings,
        ResourcePaths(mps_root, "nvidia.com/gpu"),
        FakeModes(),
        logging.getLogger("test.mps"),
        backoff=Backoff(first_s=0.01, max_s=0.04),
        recorder=Recorder(),
    )
    d.start()
    try:
        assert wait_for(lambda: sum("did not start" in r.getMessage() for r in caplog.records) >= 4)
    finally:
        d.stop()
    errors = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
    assert errors[0] == (
        "nvidia.com/gpu: MPS control daemon did not start: nvidia-cuda-mps-control is not on PATH "
        "(/nonexistent); it comes from the host driver: run the container with the NVIDIA runtime and "
        "NVIDIA_DRIVER_CAPABILITIES including compute; retrying in 0.01s"
    )
    assert [e.rsplit(" ", 1)[-1] for e in errors[:4]] == ["0.01s", "0.02s", "0.04s", "0.04s"]
    assert not d.paths.ready_marker.exists()
    # The plugin reads why: the status stays "failing" with the last error between attempts.
    status = read_status(d.paths.status_file)
    assert status is not None and status.state == "stopped"
    assert isinstance(d.modes, FakeModes) and d.modes.calls[-1] == ("DEFAULT", [UUID])


def test_status_follows_the_daemon(daemon: ResourceDaemon) -> None:
    good_path = daemon.env["PATH"]
    daemon.env["PATH"] = "/nonexistent"
    daemon.start()
    assert wait_for(lambda: (read_status(daemon.paths.status_file) or NO_STATUS).state == "failing")
    failing = read_status(daemon.paths.status_file)
    assert failing is not None and failing.error is not None
    assert failing.error.startswith("MPS control daemon did not start: nvidia-cuda-mps-control is not on")
    assert failing.is_current()
    daemon.env["PATH"] = good_path
    assert wait_for(lambda: (read_status(daemon.paths.status_file) or NO_STATUS).state == "ready")
    assert daemon.paths.ready_marker.exists()
    daemon.stop()
    stopped = read_status(daemon.paths.status_file)
    assert stopped is not None and stopped.state == "stopped" and not stopped.is_current()


def test_socket_path_too_long_is_explained(record: Path) -> None:
    root = Path("/tmp/" + "x" * 100)
    (settings,) = plan_mps(mps_config(10), inventory(gpu(0)))
    problem = ResourcePaths(root, settings.resource_name).socket_path_problem()
    assert problem is not None
    assert problem.endswith("more than the 107 a unix socket allows; use a shorter MPS root")


def test_control_log_is_streamed_without_probe_noise(
    daemon: ResourceDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.mps")
    daemon.start()
    assert wait_for(daemon.paths.ready_marker.exists)
    daemon.stop()
    streamed = [
        m.split("] ", 2)[2]
        for m in (r.getMessage() for r in caplog.records)
        if m.startswith("[nvidia.com/gpu] ")
    ]
    assert streamed == [
        "Starting control daemon",
        "Received command: set_default_active_thread_percentage 10",
        "Received command: set_default_device_pinned_mem_limit 0 1536M",
        "Received command: quit",
        "Control daemon exiting",
    ]
