"""The DRA plugin's node-wide lock around each prepare and unprepare: a thread lock for this process
and an `flock` on a file in the plugin's folder, so a second plugin instance (a rolling update) waits
its turn. Waiting longer than the kubelet would is answered with TimeoutError, which the kubelet retries.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator


@contextlib.contextmanager
def node_lock(lock: threading.Lock, path: str, wait_s: float) -> Iterator[None]:
    if not lock.acquire(timeout=wait_s):
        raise TimeoutError(f"another prepare or unprepare has held this plugin for over {wait_s:g}s; "
                           "the kubelet retries")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"another plugin instance holds {path}; "
                                           "the kubelet retries") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing releases the flock
    finally:
        lock.release()
