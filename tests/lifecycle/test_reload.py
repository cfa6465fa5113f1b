"""SIGHUP reloads: whatever fails while preparing the new config, the old one keeps serving."""

from __future__ import annotations

import argparse
import logging

import pytest

from nvdp.daemon.guard import guarded_thread
from nvdp.daemon.pernode.nodechoice import NodeConfigRule
from nvdp.daemon.pernode.nodeconfig import Chosen
from nvdp.daemon.runloop import EXIT_FAILED
from nvdp.daemon.skeleton import Skeleton
from nvdp.plugin.prepare import NvmlMissing, Prepared
from nvdp.plugin.work import DevicePluginWork

LOG = logging.getLogger("test.reload")


class Exploding(DevicePluginWork):
    def __init__(self, error: BaseException) -> None:
        super().__init__(Skeleton("nvidia-device-plugin", LOG, {}), argparse.Namespace())
        self.error = error

    def prepare(self, chosen: Chosen | None) -> Prepared:
        raise self.error


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("NVML handle went away"), KeyError("uuid")])
def test_any_exception_during_reload_keeps_the_old_config(error: Exception,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    process = Exploding(error)
    rule = NodeConfigRule(None, lambda *a, **k: None, LOG)
    assert not rule.again(process.reload, forced=True)  # returns instead of raising into the loop
    failed = [r for r in caplog.records if r.getMessage().startswith("Reload failed unexpectedly")]
    assert len(failed) == 1
    assert failed[0].getMessage().endswith("still serving the previous configuration")
    assert type(error).__name__ in failed[0].getMessage()
    assert process.manager is None and process.health.monitor is None


class WithoutGpus(DevicePluginWork):
    """Keeps running without GPUs; a guarded thread dies while it starts."""

    def __init__(self) -> None:
        super().__init__(Skeleton("nvidia-device-plugin", LOG, {}), argparse.Namespace())

    def prepare(self, chosen: Chosen | None) -> Prepared:
        def broken() -> None:
            raise RuntimeError("bug in a background thread")

        guarded_thread(broken, "t", LOG, "The test thread").start()
        missing = NvmlMissing("no NVML here")
        missing.fail = False  # keep running without GPUs, waiting for signals
        raise missing


def test_a_dead_guarded_thread_makes_the_plugin_exit_1(caplog: pytest.LogCaptureFixture) -> None:
    work = WithoutGpus()
    assert work.skeleton.run(work) == EXIT_FAILED
    assert "Exiting so that the kubelet restarts this pod (see the error above)" in caplog.messages
