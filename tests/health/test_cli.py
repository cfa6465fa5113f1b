"""`nvdp health`: show the GPUs that are down, clear them by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.cli import main
from nvdp.health.ledger import Cause, Ledger, Settings
from nvdp.health.state import take_clear_requests, write_state
from nvdp.health.xids import Remedy


def record(tmp_path: Path) -> str:
    ledger = Ledger(Settings(after=60))
    cause = Cause("XID 95 (uncontained ECC error)", Remedy.RESET, 95)
    ledger.fault("GPU-0", {"GPU-0"}, cause, 1_700_000_000.0)
    write_state(str(tmp_path), "nvidia-device-plugin", ledger.record(), 1_700_000_001.0)
    return str(tmp_path)


def test_show_lists_the_gpus_that_are_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"No GPU is down (no health.json in {tmp_path} yet).\n"
    assert main(["health", "--state-dir", record(tmp_path), "show"]) == 0
    assert capsys.readouterr().out == (
        "GPU-0  needs-reset  since 2023-11-14 22:13:20Z  XID 95 (uncontained ECC error)\n")


def test_clear_asks_the_plugin_and_refuses_what_is_not_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEALTH_STATE_DIR", record(tmp_path))
    assert main(["health", "clear", "GPU-7"]) == 1
    assert "not down on this node: GPU-7 (down: GPU-0)" in capsys.readouterr().err
    assert main(["health", "clear"]) == 2
    assert main(["health", "clear", "GPU-0"]) == 0
    assert "Asked the plugin to clear GPU-0" in capsys.readouterr().out
    assert take_clear_requests(str(tmp_path)) == ["GPU-0"]
    assert main(["health", "clear", "--all"]) == 0
    assert take_clear_requests(str(tmp_path)) is None


def test_without_a_directory_it_says_where_to_point_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEALTH_STATE_DIR", raising=False)
    assert main(["health"]) == 2
    assert "pass --state-dir, or set HEALTH_STATE_DIR" in capsys.readouterr().err


def test_the_doctor_names_the_gpus_held_down_and_what_brings_each_back(tmp_path: Path) -> None:
    from nvdp.doctor.health_check import health_findings

    assert health_findings("") == []  # no record kept: no check
    (empty,) = health_findings(str(tmp_path / "none"))
    assert empty.status == "PASS" and empty.detail.startswith("no GPU is down")
    (down,) = health_findings(record(tmp_path))
    assert down.status == "FAIL"
    assert down.detail == "1 GPU(s) down: GPU-0 needs-reset: XID 95 (uncontained ECC error)"
    assert down.fix.startswith("reset the GPU once no process uses it (nvidia-smi -r -i <uuid>)")
    (tmp_path / "health.json").write_text("[")
    (broken,) = health_findings(str(tmp_path))
    assert broken.status == "FAIL" and "is not JSON" in broken.detail
