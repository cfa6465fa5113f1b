"""control.log: streamed from where it ended before the daemon started, and kept bounded."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from nvdp.mps.logtail import DEFAULT_MAX_BYTES, LogTail, max_bytes_from_env
from nvdp.mps.paths import ResourcePaths

from .processes import MpsNode
from .waiting import wait_for

pytestmark = pytest.mark.slow  # starts processes

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


PAGE = 4096  # the unit a filesystem frees in (tmpfs pages, ext4 blocks)


def held(path: Path) -> int:
    """The bytes a file holds on its filesystem (a freed hole holds none)."""
    return path.stat().st_blocks * 512


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
    lines = [f"line {n:03d} " + "x" * 300 for n in range(40)]

    def shown(line: str) -> bool:
        return streamed(caplog)[-1:] == [line]

    for line in lines:
        append(log_file, line, "probe")
        # The file never holds more than the limit plus what one poll lets in: the lines already
        # shown are freed (13 KB written, at most two pages held).
        assert held(log_file) <= 2 * PAGE
        assert wait_for(lambda: shown(line))  # noqa: B023 - called before the loop moves on
    assert streamed(caplog) == lines
    assert log_file.stat().st_size > 40 * 300  # the size still counts the freed part
    rotated = log_file.with_name("control.log.1")
    # The lines since the rotation before: whole lines, the last one shown among them.
    kept = rotated.read_text().splitlines()
    assert kept and set(kept) <= {*lines, "probe"} and lines[-1] in kept


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
        assert held(control_log) <= 2 * limit + 2 * PAGE
        out = second.output()
        assert "[nvidia.com/gpu] " in out
        assert "Control daemon exiting" not in out
        assert "Received command: quit" not in out
    finally:
        node.stop()


WRITER = """
import os, sys, time
path, count, per_open = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "per-line"
flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
fd = None if per_open else os.open(path, flags, 0o644)
for n in range(count):
    line = f"burst {n:05d} ".encode() + b"y" * 20 + b"\\n"
    if per_open:
        one = os.open(path, flags, 0o644)
        os.write(one, line)
        os.close(one)
    else:
        os.write(fd, line)
    if n % 50 == 49:
        time.sleep(0.0005)  # a burst that lasts long enough to meet many rotations
"""


@pytest.mark.parametrize("writer", ["held-open", "per-line"])
def test_no_line_is_lost_when_the_file_is_rotated_under_a_burst(
    log_file: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    """Every line of a 30,000-line burst is shown, once and in order, while the file is rotated under it.

    The daemon may hold control.log open (O_APPEND) or open it for each line; either way a line
    written between two steps of a rotation must not fall between the copy and the emptied file.
    """
    count = 30_000
    shown: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            shown.append(record.getMessage().split("] ", 1)[1])

    burst_log = logging.getLogger("test.tail.burst")
    burst_log.propagate = False
    burst_log.setLevel(logging.INFO)
    handler = Collect()
    burst_log.addHandler(handler)
    # Polled often and rotated past a few lines, so rotations fall inside the burst again and again.
    monkeypatch.setattr("nvdp.mps.logtail.POLL_S", 0.001)
    tail = LogTail(log_file, "res", burst_log, max_bytes=4096)
    rotations = 0
    real_rotate = tail._rotate

    def counting_rotate(handle: BinaryIO) -> None:
        nonlocal rotations
        rotations += 1
        real_rotate(handle)

    monkeypatch.setattr(tail, "_rotate", counting_rotate)
    try:
        tail.start()
        subprocess.run([sys.executable, "-c", WRITER, str(log_file), str(count), writer], check=True)
        expected = [f"burst {n:05d} " + "y" * 20 for n in range(count)]
        # Until the last line is shown (or the burst is all there): a lost line is reported below.
        wait_for(lambda: shown[-1:] == expected[-1:] or len(shown) >= count, limit_s=30)
    finally:
        tail.stop()
        burst_log.removeHandler(handler)
    assert rotations >= 3
    missing = sorted(set(expected) - set(shown))
    assert not missing, f"{len(missing)} of {count} lines never shown, first {missing[:3]}"
    assert shown == expected
    # What the tail frees is bounded: control.log holds no more than the limit and one poll's lines.
    assert held(log_file) < 4096 + 64 * 1024
