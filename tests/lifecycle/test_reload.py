"""SIGHUP reloads: whatever fails while preparing the new config, the old one keeps serving."""

from __future__ import annotations

import argparse
import logging

import pytest

from nvdp.daemon.guard import guarded_thread, on_fatal
from nvdp.nodechoice import NodeConfigRule
from nvdp.nodeconfig import Chosen
from nvdp.plugin.main import PluginProcess
from nvdp.plugin.prepare import NvmlMissing, Prepared
from nvdp.runloop import EXIT_FAILED, Inbox


class Exploding(PluginProcess):
    def __init__(self, error: BaseException) -> None:
        super().__init__(argparse.Namespace(), {}, logging.getLogger("test.reload"))
        self.error = error

    def prepare(self, chosen: Chosen | None) -> Prepared:
        raise self.error


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("NVML handle went away"), KeyError("uuid")])
def test_any_exception_during_reload_keeps_the_old_config(error: Exception,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    process = Exploding(error)
    rule = NodeConfigRule(None, lambda *a, **k: None, process.log)
    assert not rule.again(process.reload, forced=True)  # returns instead of raising into the loop
    failed = [r for r in caplog.records if r.getMessage().startswith("Reload failed unexpectedly")]
    assert len(failed) == 1
    assert failed[0].getMessage().endswith("still serving the previous configuration")
    assert type(error).__name__ in failed[0].getMessage()
    assert process.manager is None and process.health is None


class WithoutGpus(PluginProcess):
    def __init__(self) -> None:
        super().__init__(argparse.Namespace(), {}, logging.getLogger("test.reload"))

    def prepare(self, chosen: Chosen | None) -> Prepared:
        missing = NvmlMissing("no NVML here")
        missing.fail = False  # keep running without GPUs, waiting for signals
        raise missing


def test_a_dead_guarded_thread_makes_the_plugin_exit_1(caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox()
    on_fatal(inbox.post_fatal)
    try:
        def broken() -> None:
            raise RuntimeError("bug in a background thread")

        guarded_thread(broken, "t", logging.getLogger("test.reload"), "The test thread").start()
        assert WithoutGpus().run(inbox) == EXIT_FAILED
    finally:
        on_fatal(None)
        inbox.close()
    assert "Exiting so that the kubelet restarts this pod (see the error above)" in caplog.messages
