"""control.log: streamed from where it ended before the daemon started, and kept bounded."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.mps.logtail import DEFAULT_MAX_BYTES, LogTail, max_bytes_from_env
from nvdp.mps.paths import ResourcePaths

from .processes import MpsNode
from .waiting import wait_for

LOG = logging.getLogger("test.tail")


def streamed(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m.split("] ", 1)[1] for m in (r.getMessage() for r in caplog.records) if m.startswith("[res] ")]


@pytest.fixture
def log_file(mps_root: Path) -> Path:
    return mps_root / "control.log"


@pytest.fixture
def tail(log_file: Path) -> Iterator[LogTail]:
    t = LogTail(log_file, "res", LOG, skip="probe", max_bytes=200)
    yield t
    t.stop()


def append(path: Path, *lines: str) -> None:
    with path.open("a") as out:
        out.writelines(f"{line}\n" for line in lines)


def test_lines_written_before_the_start_are_not_replayed(
    tail: LogTail, log_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.tail")
    append(log_file, "[old] Control daemon exiting")
    tail.start()
    append(log_file, "[new] Starting control daemon")
    assert wait_for(lambda: streamed(caplog) == ["[new] Starting control daemon"])
    # A restart of the tail (the supervisor starts it on every launch) keeps its place too.
    tail.stop()
    append(log_file, "[new] Received command: quit")
    tail.start()
    assert wait_for(lambda: streamed(caplog)[-1:] == ["[new] Received command: quit"])
    assert "[old] Control daemon exiting" not in streamed(caplog)


def test_a_file_created_after_the_start_is_read_from_its_beginning(
    tail: LogTail, log_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.tail")
    tail.start()
    append(log_file, "first", "second")
    assert wait_for(lambda: streamed(caplog) == ["first", "second"])


def test_the_file_is_rotated_past_its_limit_without_losing_lines(
    tail: LogTail, log_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.tail")
    tail.start()
    lines = [f"line {n:03d} " + "x" * 30 for n in range(40)]

    def shown(line: str) -> bool:
        return streamed(caplog)[-1:] == [line]

    for line in lines:
        append(log_file, line, "probe")
        # The file never holds much more than the limit plus what one poll lets in.
        assert log_file.stat().st_size < 200 + 4 * 50
        assert wait_for(lambda: shown(line))  # noqa: B023 - called before the loop moves on
    assert streamed(caplog) == lines
    rotated = log_file.with_name("control.log.1")
    assert rotated.exists() and rotated.stat().st_size >= 200


def test_limit_from_the_environment() -> None:
    assert max_bytes_from_env({"MPS_CONTROL_LOG_MAX_BYTES": "4096"}) == 4096
    assert max_bytes_from_env({"MPS_CONTROL_LOG_MAX_BYTES": "lots"}) == DEFAULT_MAX_BYTES
    assert max_bytes_from_env({}) == DEFAULT_MAX_BYTES == 1024 * 1024


@pytest.mark.slow
def test_a_new_daemon_process_does_not_replay_the_old_log_and_probes_do_not_grow_it(mps_root: Path) -> None:
    node = MpsNode(mps_root)
    control_log = ResourcePaths(node.mps_root, "nvidia.com/gpu").control_log
    try:
        first = node.start_daemon()
        assert first.wait_output("nvidia.com/gpu: ready ("), first.output()
        first.signal(signal.SIGTERM)
        assert first.wait() == 0
        assert "Control daemon exiting" in control_log.read_text()

        limit = 2000
        second = node._start(
            "daemon",
            [*node.daemon_argv()],
            env={"MPS_CONTROL_LOG_MAX_BYTES": str(limit)},
        )
        assert second.wait_output("nvidia.com/gpu: ready ("), second.output()
        # Probes every 0.1 s: the file is rotated instead of growing.
        rotated = control_log.with_name("control.log.1")
        assert wait_for(rotated.exists), second.output()
        assert control_log.stat().st_size < 2 * limit
        out = second.output()
        assert "[nvidia.com/gpu] " in out
        assert "Control daemon exiting" not in out
        assert "Received command: quit" not in out
    finally:
        node.stop()
