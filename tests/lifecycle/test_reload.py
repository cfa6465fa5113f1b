"""SIGHUP reloads: whatever fails while preparing the new config, the old one keeps serving."""

from __future__ import annotations

import argparse
import logging

import pytest

from nvdp.plugin.main import PluginProcess, Prepared


class Exploding(PluginProcess):
    def __init__(self, error: BaseException) -> None:
        super().__init__(argparse.Namespace(), {}, logging.getLogger("test.reload"))
        self.error = error

    def prepare(self) -> Prepared:
        raise self.error


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("NVML handle went away"), KeyError("uuid")])
def test_any_exception_during_reload_keeps_the_old_config(error: Exception,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    process = Exploding(error)
    process.reload()  # returns instead of raising into the signal loop
    failed = [r for r in caplog.records if r.getMessage().startswith("Reload failed unexpectedly")]
    assert len(failed) == 1
    assert failed[0].getMessage().endswith("still serving the previous configuration")
    assert type(error).__name__ in failed[0].getMessage()
    assert process.manager is None and process.health is None
