"""The plugin process tells which MPS problem keeps it waiting: failing daemon, unusable root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.kubelet import KubeletSim

from .processes import MpsNode

pytestmark = pytest.mark.slow

LABEL_HINT = "kubectl label node gpu-node nvidia.com/mps.capable=true"


@pytest.fixture
def node(mps_root: Path) -> Iterator[MpsNode]:
    n = MpsNode(mps_root)
    yield n
    n.stop()


def test_a_failing_daemon_is_reported_by_the_plugin_with_its_error(node: MpsNode) -> None:
    with KubeletSim(node.kubelet_dir) as kubelet:
        # The daemon runs (the node is labelled) but the driver's nvidia-cuda-mps-control is missing.
        daemon = node._start("daemon", node.daemon_argv(), env={"PATH": os.environ["PATH"]})
        assert daemon.wait_output("nvidia-cuda-mps-control is not on PATH"), daemon.output()
        plugin = node.start_plugin()
        expected = (
            "nvidia.com/gpu: waiting for the MPS control daemon: the MPS daemon pod on node gpu-node is "
            "running but failing; its last error: MPS control daemon did not start: nvidia-cuda-mps-control "
            "is not on PATH"
        )
        assert plugin.wait_output(expected), plugin.output()
        assert LABEL_HINT not in plugin.output()
        assert kubelet.resources() == []


def test_an_unusable_root_is_reported_by_the_plugin_with_the_fix(node: MpsNode) -> None:
    node.mps_root.write_text("in the way\n")
    plugin = node.start_plugin()
    expected = (
        f"nvidia.com/gpu: waiting for the MPS control daemon: the MPS root {node.mps_root} is unusable: "
        f"{node.mps_root} is a file, not a directory; fix: "
    )
    assert plugin.wait_output(expected), plugin.output()
    assert LABEL_HINT not in plugin.output()
