"""Seed 004 end to end: MPS with 10 replicas on one T4, daemon and plugin as separate processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.mps.paths import ResourcePaths
from sim.kubelet import KubeletSim
from sim.mps import read_record, recorded_commands

from .processes import MpsNode
from .waiting import wait_for

pytestmark = pytest.mark.slow

T4 = "GPU-a4d98c34-f034-41fa-9519-b5bab976e4df"
LABEL_HINT = "kubectl label node gpu-node nvidia.com/mps.capable=true"
SETTINGS = [
    "set_default_active_thread_percentage 10",
    "set_default_device_pinned_mem_limit 0 1536M",
]


@pytest.fixture
def node(mps_root: Path) -> Iterator[MpsNode]:
    n = MpsNode(mps_root)
    yield n
    n.stop()


@pytest.fixture
def kubelet(node: MpsNode) -> Iterator[KubeletSim]:
    with KubeletSim(node.kubelet_dir) as sim:
        yield sim


def paths(node: MpsNode) -> ResourcePaths:
    return ResourcePaths(node.mps_root, "nvidia.com/gpu")


def daemon_pids(node: MpsNode) -> list[int]:
    return [e["pid"] for e in read_record(node.record) if e["event"] == "start"]


def test_plugin_first_waits_with_the_label_hint_then_serves(node: MpsNode, kubelet: KubeletSim) -> None:
    plugin = node.start_plugin()
    assert plugin.wait_output(LABEL_HINT, count=2), plugin.output()
    assert plugin.running()
    assert kubelet.resources() == []

    daemon = node.start_daemon()
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=10, healthy=10, timeout=30)
    assert sorted(d["id"] for d in devices) == [f"{T4}::{n}" for n in range(10)]
    commands = recorded_commands(node.record)
    assert commands[:3] == [*SETTINGS, "get_default_active_thread_percentage"]
    # Everything after the settings is a probe (the daemon's and the plugin's health checks).
    assert set(commands[3:]) <= {"get_default_active_thread_percentage"}
    (start,) = [e for e in read_record(node.record) if e["event"] == "start"]
    assert start["env"] == {
        "CUDA_MPS_LOG_DIRECTORY": f"{node.mps_root}/nvidia.com/gpu/log",
        "CUDA_MPS_PIPE_DIRECTORY": f"{node.mps_root}/nvidia.com/gpu/pipe",
        "CUDA_VISIBLE_DEVICES": T4,
    }
    assert node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"

    out = daemon.output()
    assert "mps-control-daemon 0.1.0" in out
    assert f"config: {node.config}" in out
    assert (
        f"resource nvidia.com/gpu: active thread percentage 10; GPU 0 (Tesla T4, {T4}): 10 replicas, "
        "1536M pinned memory each" in out
    )
    assert f"nvidia.com/gpu: MPS control daemon started (pid {start['pid']}) on {T4}" in out
    assert f"nvidia.com/gpu: ready ({paths(node).ready_marker})" in out

    response = kubelet.allocate("nvidia.com/gpu", [[devices[0]["id"]]])
    envs = response["container_responses"][0]["envs"]
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"

    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert recorded_commands(node.record)[-1] == "quit"
    assert node.node.compute_mode(T4) == "DEFAULT"
    assert not paths(node).ready_marker.exists()
    # The plugin keeps serving but reports the devices Unhealthy while the daemon is away.
    kubelet.wait_for_resource("nvidia.com/gpu", count=10, healthy=0, timeout=30)
    assert plugin.running()


def test_daemon_first_then_plugin_serves_without_a_hint(node: MpsNode, kubelet: KubeletSim) -> None:
    daemon = node.start_daemon()
    assert wait_for(paths(node).ready_marker.exists), daemon.output()
    plugin = node.start_plugin()
    kubelet.wait_for_resource("nvidia.com/gpu", count=10, healthy=10, timeout=30)
    assert LABEL_HINT not in plugin.output()


def test_killed_daemon_is_restarted_and_devices_return_to_healthy(node: MpsNode, kubelet: KubeletSim) -> None:
    daemon = node.start_daemon()
    node.start_plugin()
    kubelet.wait_for_resource("nvidia.com/gpu", count=10, healthy=10, timeout=30)
    (first,) = daemon_pids(node)
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: len(daemon_pids(node)) == 2), daemon.output()
    kubelet.wait_for_resource("nvidia.com/gpu", count=10, healthy=10, timeout=30)
    assert f"nvidia.com/gpu: MPS control daemon (pid {first}) " in daemon.output()
    assert "restarting it in 1s" in daemon.output()
    # The restarted daemon got the same settings.
    assert recorded_commands(node.record).count(SETTINGS[1]) == 2
    assert node.node.compute_mode(T4) == "EXCLUSIVE_PROCESS"


def test_sighup_reloads_the_config(node: MpsNode) -> None:
    daemon = node.start_daemon()
    assert wait_for(paths(node).ready_marker.exists), daemon.output()
    node.write_config(4)
    daemon.signal(signal.SIGHUP)
    assert wait_for(lambda: len(daemon_pids(node)) == 2), daemon.output()
    assert wait_for(paths(node).ready_marker.exists)
    commands = recorded_commands(node.record)
    assert commands[commands.index("quit") :] == [
        "quit",
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 3840M",
        "get_default_active_thread_percentage",
    ]


def test_config_without_mps_has_nothing_to_do(node: MpsNode) -> None:
    node.config.write_text("version: v1\n")
    daemon = node.start_daemon()
    assert daemon.wait_output(f"no resource is shared with MPS in {node.config}; nothing to do")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert read_record(node.record) == []


def test_invalid_replicas_stop_the_daemon_with_the_fix(node: MpsNode) -> None:
    node.write_config(49)
    daemon = node.start_daemon()
    assert daemon.wait() == 1
    assert "set replicas to 48 or less" in daemon.output()
    assert "Traceback" not in daemon.output()


def test_mig_devices_are_refused_with_the_fix(mps_root: Path) -> None:
    node = MpsNode(mps_root, profile="h100-mig-single")
    node.config.write_text(
        "version: v1\nflags:\n  migStrategy: single\nsharing:\n  mps:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    try:
        daemon = node.start_daemon()
        assert daemon.wait() == 1
    finally:
        node.stop()
    out = daemon.output()
    assert "sharing using MPS is not supported for MIG devices (MIG device 0:0, " in out
    assert "share MIG devices with sharing.timeSlicing instead" in out
    assert "Traceback" not in out
    assert read_record(node.record) == []


def test_sighup_with_a_broken_config_keeps_the_running_daemon(node: MpsNode) -> None:
    daemon = node.start_daemon()
    assert wait_for(paths(node).ready_marker.exists), daemon.output()
    node.config.write_text("version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n")
    daemon.signal(signal.SIGHUP)
    assert daemon.wait_output("Reload failed; still serving the previous configuration.")
    assert daemon.running()
    assert paths(node).ready_marker.exists()
    assert len(daemon_pids(node)) == 1
    assert "quit" not in recorded_commands(node.record)
