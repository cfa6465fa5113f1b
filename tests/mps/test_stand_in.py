"""The stand-in nvidia-cuda-mps-control behaves like the real one for what the project uses."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from nvdp.mps import control
from nvdp.mps.paths import ResourcePaths
from sim.mps import RECORD_ENV, connect_client, limits_set, read_record, recorded_commands

from .waiting import wait_for

pytestmark = pytest.mark.slow  # starts processes


@pytest.fixture
def paths(mps_root: Path, record: Path) -> ResourcePaths:
    return ResourcePaths(mps_root, "nvidia.com/gpu")


def answers(paths: ResourcePaths) -> bool:
    try:
        control.probe(paths.pipe_dir)
    except control.MpsCommandError:
        return False
    return True


def env(paths: ResourcePaths) -> dict[str, str]:
    return control.control_env(paths.pipe_dir, paths.log_dir, "GPU-1")


def test_client_without_daemon_fails(paths: ResourcePaths) -> None:
    with pytest.raises(control.MpsCommandError) as err:
        control.probe(paths.pipe_dir)
    assert str(err.value) == (
        "nvidia-cuda-mps-control exited with status 1: Cannot find MPS control daemon process"
    )


def test_daemon_answers_records_and_quits(paths: ResourcePaths, record: Path) -> None:
    control.start_daemon(env(paths))
    pid = int(paths.pid_file.read_text())
    assert paths.control_socket.is_socket()
    out = control.send_commands(
        [
            "set_default_active_thread_percentage 10",
            "set_default_device_pinned_mem_limit 0 1536M",
            "get_default_active_thread_percentage",
            "get_default_device_pinned_mem_limit 0",
            "get_server_list",
        ],
        env(paths),
    )
    # As the real daemon: the percentage set is echoed, the memory limit is not; no server runs yet.
    assert out == "10.0\n10.0\n1536M\n"
    with pytest.raises(control.MpsCommandError, match="already running"):
        control.start_daemon(env(paths))
    control.send_commands(["quit"], env(paths))
    events = read_record(record)
    assert events[0] == {
        "event": "start",
        "pid": pid,
        "env": {
            "CUDA_MPS_LOG_DIRECTORY": str(paths.log_dir),
            "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe_dir),
            "CUDA_VISIBLE_DEVICES": "GPU-1",
        },
    }
    assert recorded_commands(record)[-1] == "quit"
    assert events[-1]["event"] == "exit"
    assert not paths.control_socket.exists()
    assert not paths.pid_file.exists()
    log = paths.control_log.read_text()
    assert "Received command: set_default_active_thread_percentage 10" in log


def test_bad_values_are_answered_with_an_error(paths: ResourcePaths) -> None:
    control.start_daemon(env(paths))
    try:
        out = control.send_commands(
            ["set_default_active_thread_percentage 0", "set_default_device_pinned_mem_limit x 1G", "nope"],
            env(paths),
        )
    finally:
        control.send_commands(["quit"], env(paths))
    assert out.splitlines() == [
        "Invalid active thread percentage 0",
        "Invalid arguments: x 1G",
        "Unrecognized command: nope",
    ]


def test_killed_daemon_leaves_a_socket_a_new_one_replaces(paths: ResourcePaths) -> None:
    control.start_daemon(env(paths))
    pid = int(paths.pid_file.read_text())
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not answers(paths))
    assert paths.control_socket.exists()
    control.start_daemon(env(paths))
    control.probe(paths.pipe_dir)
    control.send_commands(["quit"], env(paths))


def test_missing_binary_names_the_fix(paths: ResourcePaths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(control.MpsCommandError) as err:
        control.probe(paths.pipe_dir)
    assert str(err.value) == (
        "nvidia-cuda-mps-control is not on PATH (/nonexistent); it comes from the host driver: run the "
        "container with the NVIDIA runtime and NVIDIA_DRIVER_CAPABILITIES including compute"
    )


def test_every_limit_set_is_recorded_beside_the_log_without_the_record_variable(
        paths: ResourcePaths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RECORD_ENV)  # as on a node, where nothing sets the daemon's environment
    control.start_daemon(env(paths))
    pid = int(paths.pid_file.read_text())
    try:
        control.send_commands(["set_default_active_thread_percentage 25",
                               "set_default_device_pinned_mem_limit 0 3840M",
                               "set_default_active_thread_percentage 0"], env(paths))  # refused: not set
        server = connect_client(paths.pipe_dir, {})["server"]
        control.send_commands([f"set_active_thread_percentage {server} 50",
                               f"set_device_pinned_mem_limit {server} 0 7680M"], env(paths))
    finally:
        control.send_commands(["quit"], env(paths))
    assert limits_set(paths.log_dir) == [
        {"scope": "default", "server": None, "limit": "active_thread_percentage", "device": None,
         "value": "25.0", "pid": pid},
        {"scope": "default", "server": None, "limit": "device_pinned_mem_limit", "device": 0,
         "value": "3840M", "pid": pid},
        {"scope": "server", "server": server, "limit": "active_thread_percentage", "device": None,
         "value": "50.0", "pid": pid},
        {"scope": "server", "server": server, "limit": "device_pinned_mem_limit", "device": 0,
         "value": "7680M", "pid": pid},
    ]
