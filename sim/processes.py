"""A program run for the length of a block, as the demo and the real-GPU check run nvdp's daemons."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def running(argv: Sequence[str], env: Mapping[str, str], log_path: Path,
            stop_timeout: float = 15) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` with its output in `log_path`; SIGTERM when the block ends (as the kubelet stops a pod),
    killed if it has not exited `stop_timeout` seconds later. Its exit status is `returncode` after."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
