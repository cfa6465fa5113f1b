"""The MPS gate's watcher thread outlives an unexpected failure while checking the daemon."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nvdp.mps import control
from nvdp.mps.paths import ResourcePaths
from nvdp.plugin.mps_gate import MpsGate

from .waiting import wait_for

LOG = logging.getLogger("test.gate.threads")


class BrokenProbe:
    """Fails with something the gate does not expect (not MpsCommandError) while `broken` is set."""

    def __init__(self) -> None:
        self.broken = False
        self.down = False

    def __call__(self, pipe_dir: Path) -> None:
        if self.broken:
            raise PermissionError(13, "Permission denied", str(pipe_dir))
        if self.down:
            raise control.MpsCommandError("no daemon")


def test_watcher_survives_an_unexpected_error_and_keeps_reporting(
    mps_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = ResourcePaths(mps_root, "nvidia.com/gpu")
    paths.base.mkdir(parents=True)
    paths.ready_marker.write_text("1\n")
    probe = BrokenProbe()
    gate = MpsGate("nvidia.com/gpu", mps_root, "n", LOG, interval_s=0.05, probe=probe, probe_interval_s=0.02)
    changes: list[bool] = []
    try:
        gate.watch(changes.append)
        probe.broken = True
        # The failed check counts as not ready (devices Unhealthy), with the traceback in the log.
        assert wait_for(lambda: changes == [False])
        probe.broken = False
        assert wait_for(lambda: changes == [False, True])
        probe.down = True
        assert wait_for(lambda: changes == [False, True, False])
    finally:
        gate.close()
    failed = [r for r in caplog.records if "checking the MPS control daemon failed" in r.getMessage()]
    assert failed and failed[0].exc_info is not None
