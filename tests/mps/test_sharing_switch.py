"""Switching a resource between MPS and time-slicing by SIGHUP: the MPS gate comes and goes with it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.mps.paths import ResourcePaths
from sim.kubelet import KubeletSim

from .processes import MpsNode
from .waiting import wait_for

pytestmark = pytest.mark.slow

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
WAITING = "waiting for the MPS control daemon"


@pytest.fixture
def node(mps_root: Path) -> Iterator[MpsNode]:
    n = MpsNode(mps_root, replicas=4)
    yield n
    n.stop()


@pytest.fixture
def kubelet(node: MpsNode) -> Iterator[KubeletSim]:
    with KubeletSim(node.kubelet_dir) as sim:
        yield sim


def test_mps_to_time_slicing_drops_the_gate(node: MpsNode, kubelet: KubeletSim) -> None:
    daemon = node.start_daemon()
    plugin = node.start_plugin()
    kubelet.wait_for_resource("nvidia.com/gpu", count=4, healthy=4, timeout=30)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    kubelet.wait_for_resource("nvidia.com/gpu", count=4, healthy=0, timeout=30)

    node.config.write_text(TIME_SLICING)
    plugin.signal(signal.SIGHUP)
    assert plugin.wait_output("Reload applied: restarted nvidia.com/gpu"), plugin.output()
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=4, healthy=4, timeout=30)
    response = kubelet.allocate("nvidia.com/gpu", [[devices[0]["id"]]])
    assert "CUDA_MPS_PIPE_DIRECTORY" not in response["container_responses"][0]["envs"]
    # No MPS gate is left probing for a daemon the config no longer asks for.
    before = plugin.output().count("MPS control daemon")
    wait_for(lambda: False, limit_s=1.0)  # several probe intervals (0.1 s)
    assert plugin.output().count("MPS control daemon") == before
    assert plugin.running()


def test_time_slicing_to_mps_waits_for_the_daemon(node: MpsNode, kubelet: KubeletSim) -> None:
    node.config.write_text(TIME_SLICING)
    plugin = node.start_plugin()
    kubelet.wait_for_resource("nvidia.com/gpu", count=4, healthy=4, timeout=30)
    assert WAITING not in plugin.output()

    node.write_config(4)
    plugin.signal(signal.SIGHUP)
    assert plugin.wait_output("Reload applied: restarted nvidia.com/gpu"), plugin.output()
    # Nothing is advertised while no daemon answers: Allocate would hand out a dead pipe directory.
    kubelet.wait_for_disconnect("nvidia.com/gpu", timeout=30)
    assert plugin.wait_output(WAITING), plugin.output()

    node.start_daemon()
    assert wait_for(ResourcePaths(node.mps_root, "nvidia.com/gpu").ready_marker.exists)
    devices = kubelet.wait_for_resource("nvidia.com/gpu", count=4, healthy=4, timeout=30)
    response = kubelet.allocate("nvidia.com/gpu", [[devices[0]["id"]]])
    assert "CUDA_MPS_PIPE_DIRECTORY" in response["container_responses"][0]["envs"]
