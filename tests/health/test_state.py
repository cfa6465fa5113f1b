"""The health record on disk and the clear requests (nvdp.health.state), and the NVML re-check."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.health.checks import check_gpu
from nvdp.health.ledger import Check
from nvdp.health.state import StateError, read_state, request_clear, summary, take_clear_requests, write_state
from tests.lifecycle.fakes import FakeNvml


def test_the_record_is_replaced_whole_and_read_back(tmp_path: Path) -> None:
    directory = str(tmp_path / "nvdp")
    assert read_state(directory) is None
    record = {"gpus": {"GPU-0": {"state": "needs-reset"}, "GPU-1": {"state": "recovering"}}, "downs": {}}
    write_state(directory, "nvidia-device-plugin", record, 5.0)
    back = read_state(directory)
    assert back == {"version": 1, "writer": "nvidia-device-plugin", "written": 5.0, **record}
    assert summary(back) == summary(record)
    assert (summary(back).unhealthy, summary(back).needs_service) == (2, 1)
    assert [p.name for p in Path(directory).iterdir()] == ["health.json"]  # no temporary left behind


@pytest.mark.parametrize(("text", "words"), [("{", "is not JSON"), ('{"version": 7}', "is not a version 1")])
def test_a_record_that_cannot_be_used_says_so_and_how_to_start_over(
    tmp_path: Path, text: str, words: str
) -> None:
    (tmp_path / "health.json").write_text(text)
    with pytest.raises(StateError, match=words) as caught:
        read_state(str(tmp_path))
    assert "delete it to start with every GPU healthy" in str(caught.value)


def test_clear_requests_are_taken_once(tmp_path: Path) -> None:
    assert take_clear_requests(str(tmp_path)) == []
    request_clear(str(tmp_path), ["GPU-1", "GPU-0"])
    assert take_clear_requests(str(tmp_path)) == ["GPU-0", "GPU-1"]
    assert take_clear_requests(str(tmp_path)) == []
    request_clear(str(tmp_path), [])
    assert take_clear_requests(str(tmp_path)) is None  # all of them
    with pytest.raises(ValueError, match="not a GPU UUID"):
        request_clear(str(tmp_path), ["../etc"])


def test_the_recheck_reads_each_condition_and_skips_what_the_driver_lacks() -> None:
    nvml = FakeNvml(["GPU-0"])
    assert check_gpu(nvml, "GPU-0") == Check(volatile_ecc=0)
    nvml.remap_pending.add("GPU-0")
    nvml.retirement_pending.add("GPU-0")
    nvml.volatile_ecc["GPU-0"] = 3
    nvml.recovery_action["GPU-0"] = 2
    assert check_gpu(nvml, "GPU-0") == Check(
        retirement_pending=True, remap_pending=True, volatile_ecc=3, recovery_action=2
    )
    nvml.no_recheck_readings = True  # an older driver: none of the readings, the GPU itself answers
    assert check_gpu(nvml, "GPU-0") == Check()
    nvml.unanswering.add("GPU-0")
    assert check_gpu(nvml, "GPU-0") == Check(answers=False, error="NVML error 999")
    nvml.lost.add("GPU-0")
    assert check_gpu(nvml, "GPU-0").lost


def test_a_daemon_opens_its_ledger_from_the_record_and_keeps_it_across_reloads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from nvdp.config.loader import load_config
    from nvdp.health.ledger import Cause, Ledger, Settings
    from nvdp.health.settings import open_ledger
    from nvdp.health.xids import Remedy

    log = logging.getLogger("test.health")
    config = load_config(env={"HEALTH_STATE_DIR": str(tmp_path), "HEALTH_RECOVERY_AFTER": "1m"})
    assert open_ledger(config, log).unhealthy == frozenset()  # no record yet
    earlier = Ledger(Settings(after=60))
    earlier.fault("GPU-0", {"GPU-0"}, Cause("XID 79 (GPU has fallen off the bus)", Remedy.RESET, 79), 100.0)
    write_state(str(tmp_path), "nvidia-device-plugin", earlier.record(), 100.0)
    ledger = open_ledger(config, log, now=200.0)
    assert ledger.unhealthy == {"GPU-0"} and ledger.settings.after == 60
    assert "1 GPU(s) stay down as before the restart: GPU-0 (needs-reset: XID 79" in caplog.text
    again = load_config(env={"HEALTH_STATE_DIR": str(tmp_path), "HEALTH_RECOVERY_AFTER": "never"})
    assert open_ledger(again, log, ledger) is ledger and ledger.settings.after is None  # a reload
    (tmp_path / "health.json").write_text("{")
    assert open_ledger(config, log).unhealthy == frozenset()
    assert "Health record not used:" in caplog.text and "is not JSON" in caplog.text
