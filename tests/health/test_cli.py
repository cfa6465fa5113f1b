"""`nvdp health`: show the GPUs that are down, clear them by hand (reported done only once done)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from nvdp.cli import build_parser, main
from nvdp.health import cli as health_cli
from nvdp.health.cli import CHART_STATE_DIR
from nvdp.health.ledger import Cause, Ledger, Settings
from nvdp.health.state import down_gpus, read_state, take_clear_requests, write_state
from nvdp.health.xids import Remedy

ROOT = Path(__file__).resolve().parents[2]


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


class Plugin:
    """What the plugin does with clear requests (nvdp.daemon.health): takes them, clears its ledger,
    writes its record; in a thread, every 50 ms."""

    def __init__(self, directory: str, ledger: Ledger) -> None:
        self.directory, self.ledger = directory, ledger
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            asked = take_clear_requests(self.directory)
            if asked is None or asked:
                self.ledger.clear(asked, time.time())
                write_state(self.directory, "nvidia-device-plugin", self.ledger.record(), time.time())

    def __enter__(self) -> Plugin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def down_ledger(directory: Path, *gpus: str) -> Ledger:
    ledger = Ledger(Settings(after=60))
    for gpu in gpus:
        ledger.fault(gpu, {gpu}, Cause("XID 95 (uncontained ECC error)", Remedy.RESET, 95), 1_700_000_000.0)
    write_state(str(directory), "nvidia-device-plugin", ledger.record(), 1_700_000_001.0)
    return ledger


def test_clear_is_reported_once_the_plugin_has_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEALTH_STATE_DIR", str(tmp_path))
    ledger = down_ledger(tmp_path, "GPU-0", "GPU-1")
    assert main(["health", "clear", "GPU-7"]) == 1
    assert "not down on this node: GPU-7 (down: GPU-0, GPU-1)" in capsys.readouterr().err
    assert main(["health", "clear"]) == 2
    with Plugin(str(tmp_path), ledger):
        assert main(["health", "clear", "GPU-0"]) == 0
        assert capsys.readouterr().out == \
            "Cleared GPU-0: the plugin serves it again (a GPUCleared Event on the Node).\n"
        assert sorted(down_gpus(read_state(str(tmp_path)))) == ["GPU-1"]
        assert main(["health", "clear", "--all"]) == 0
        assert capsys.readouterr().out.startswith("Cleared GPU-1: ")
        assert down_gpus(read_state(str(tmp_path))) == {}
    assert main(["health", "clear", "--all"]) == 0  # nothing is down: nothing to do, and it says so
    assert capsys.readouterr().out == f"No GPU is down in {tmp_path}: nothing to clear.\n"


def test_a_clear_no_plugin_takes_is_withdrawn_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    down_ledger(tmp_path, "GPU-0")
    assert main(["health", "--state-dir", str(tmp_path), "clear", "--all", "--wait", "0.2"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("nvdp health clear: no plugin took the request within 0.2 s, so nothing "
                                   "was cleared and the request is withdrawn")
    assert take_clear_requests(str(tmp_path)) == []  # no request is left for a plugin started later
    assert sorted(down_gpus(read_state(str(tmp_path)))) == ["GPU-0"]


def test_the_state_dir_goes_before_or_after_the_action(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    down_ledger(tmp_path, "GPU-0")
    for argv in (["--state-dir", str(tmp_path), "show"], ["show", "--state-dir", str(tmp_path)]):
        assert main(["health", *argv]) == 0
        assert capsys.readouterr().out.startswith("GPU-0  needs-reset  since ")


def test_without_a_directory_it_reads_the_charts_and_says_where_to_point_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEALTH_STATE_DIR", raising=False)
    values = yaml.safe_load((ROOT / "charts" / "nvidia-device-plugin" / "values.yaml").read_text())
    assert values["devicePlugin"]["healthRecovery"]["stateDir"] == CHART_STATE_DIR
    args = build_parser().parse_args(["health"])
    assert args.state_dir == CHART_STATE_DIR
    args.state_dir = "/nonexistent/nvdp"
    assert health_cli.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("nvdp health: no health record folder /nonexistent/nvdp: run this in the plugin's "
                          "pod")
    assert "pass --state-dir (or set HEALTH_STATE_DIR)" in err


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
