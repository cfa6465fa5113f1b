"""The MPS daemon's and the plugin's MPS series, scraped from the running processes (seed 004's set-up)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim
from sim.mps import read_record
from tests.integration.scrape import free_port, scrape, value, wait_for_http

from .processes import MpsNode
from .waiting import wait_for

pytestmark = pytest.mark.slow
GPU = "nvidia.com/gpu"


@pytest.fixture
def node(mps_root: Path) -> Iterator[MpsNode]:
    n = MpsNode(mps_root)
    yield n
    n.stop()


def test_daemon_and_plugin_report_mps_readiness_restarts_and_commands(node: MpsNode) -> None:
    daemon_port, plugin_port = free_port(), free_port()
    with KubeletSim(node.kubelet_dir) as kubelet:
        plugin = node._start("plugin", [sys.executable, "-m", "nvdp.plugin.main", "--config-file",
                                        str(node.config), "--device-plugin-path", str(node.kubelet_dir),
                                        f"--metrics-address=127.0.0.1:{plugin_port}"])
        assert plugin.wait_output("waiting for the MPS control daemon"), plugin.output()
        assert wait_for(lambda: value(scrape(plugin_port), "nvdp_mps_daemon_ready", resource=GPU) == 0)
        daemon = node._start("daemon", [sys.executable, "-m", "nvdp.mps.main", "--config-file",
                                        str(node.config), f"--metrics-address=127.0.0.1:{daemon_port}"])
        kubelet.wait_for_resource(GPU, count=10, healthy=10, timeout=30)
        assert wait_for(lambda: value(scrape(plugin_port), "nvdp_mps_daemon_ready", resource=GPU) == 1)
        wait_for_http(plugin_port, "/readyz", 200)

        (first,) = [e["pid"] for e in read_record(node.record) if e["event"] == "start"]
        os.kill(first, signal.SIGKILL)
        assert daemon.wait_output("restarting it in"), daemon.output()
        kubelet.wait_for_resource(GPU, count=10, healthy=10, timeout=30)
        assert wait_for(
            lambda: value(scrape(daemon_port), "nvdp_mps_control_daemon_ready", resource=GPU) == 1
        )

    samples = scrape(daemon_port)
    assert value(samples, "nvdp_mps_control_daemon_restarts_total", resource=GPU) == 1
    assert value(samples, "nvdp_mps_control_daemon_starts_total", resource=GPU, result="started") == 2
    for command in ("set_default_active_thread_percentage", "set_default_device_pinned_mem_limit"):
        assert value(samples, "nvdp_mps_control_commands_total", resource=GPU, command=command,
                     result="ok") == 2
    probes = value(samples, "nvdp_mps_control_commands_total", resource=GPU,
                   command="get_default_active_thread_percentage", result="ok")
    assert probes is not None and probes >= 2
    build = [k for k in samples if k[0] == "nvdp_build_info"]
    assert build and dict(build[0][1])["component"] == "mps-control-daemon"
