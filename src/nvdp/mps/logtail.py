"""Follow a daemon's control.log into our own log, each line prefixed with the resource name.

The tail starts at the end of what the file already holds: the MPS root outlives daemon pods, and
an earlier pod's lines (its "Control daemon exiting" with old timestamps) are not news. The file
sits on the node's /run (tmpfs, RAM) and the daemon appends a line for every command, health
probes included, so the tail also bounds it: past `max_bytes`, once everything is read, the file is
copied to control.log.1 (replacing the previous copy) and emptied. NVIDIA's daemon appends
(O_APPEND), so it keeps writing at the new end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

POLL_S = 0.2
MAX_BYTES_ENV = "MPS_CONTROL_LOG_MAX_BYTES"
DEFAULT_MAX_BYTES = 1024 * 1024
ROTATED_SUFFIX = ".1"
ERROR_PAUSE_S = 5.0


def max_bytes_from_env(env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(MAX_BYTES_ENV, "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_MAX_BYTES
    return value if value > 0 else DEFAULT_MAX_BYTES


class LogTail:
    def __init__(
        self,
        path: Path,
        prefix: str,
        log: logging.Logger,
        skip: str = "",
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.path = path
        self.prefix = prefix
        self.log = log
        # Lines containing `skip` are left out: the daemon logs every health probe we send it.
        self.skip = skip
        self.max_bytes = max_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # (inode, offset) up to which the file is not news: what it held before the first start(),
        # then where the last stop() left off.
        self._old: tuple[int, int] | None = None
        self._started = False

    @property
    def rotated_path(self) -> Path:
        return self.path.with_name(self.path.name + ROTATED_SUFFIX)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        if not self._started:
            # Measured here, before the caller starts the daemon, so none of its lines are skipped.
            self._started = True
            with contextlib.suppress(OSError):
                st = self.path.stat()
                self._old = (st.st_ino, st.st_size)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"tail {self.prefix}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        # An unexpected error must not end the tail silently: say so and try again.
        while not self._stop.is_set():
            try:
                self._follow()
                return
            except Exception:
                self.log.exception("[%s] error following %s; retrying", self.prefix, self.path)
                if self._stop.wait(ERROR_PAUSE_S):
                    return

    def _follow(self) -> None:
        handle: BinaryIO | None = None
        inode: int | None = None
        stopping = False
        try:
            while True:
                if handle is None:
                    handle, inode = self._open()
                if handle is not None:
                    while line := handle.readline():
                        if not line.endswith(b"\n"):
                            # A line still being written: read it again whole on the next pass.
                            handle.seek(-len(line), os.SEEK_CUR)
                            break
                        self._emit(line)
                    if self._replaced(handle, inode):
                        handle.close()
                        handle = None
                        continue
                    if handle.tell() >= self.max_bytes:
                        self._rotate(handle)
                if stopping:
                    return
                # One more pass after stop(), so the daemon's last words (after `quit`) are shown.
                stopping = self._stop.wait(POLL_S)
        finally:
            if handle is not None:
                # Where a later start() picks up: shown lines are not shown twice.
                self._old = (inode, handle.tell()) if inode is not None else None
                handle.close()

    def _open(self) -> tuple[BinaryIO | None, int | None]:
        try:
            handle = self.path.open("rb")
        except OSError:
            return None, None
        inode = os.fstat(handle.fileno()).st_ino
        if self._old is not None:
            old_inode, old_size = self._old
            self._old = None
            if inode == old_inode:
                handle.seek(old_size)
        return handle, inode

    def _emit(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\n")
        if not (self.skip and self.skip in text):
            self.log.info("[%s] %s", self.prefix, text)

    def _rotate(self, handle: BinaryIO) -> None:
        shown = handle.tell()
        try:
            shutil.copyfile(self.path, self.rotated_path)
            os.truncate(self.path, 0)
        except OSError as err:
            self.log.warning("[%s] cannot rotate %s: %s", self.prefix, self.path, err)
            # Not again for every poll: only after another max_bytes.
            self.max_bytes = shown + self.max_bytes
            return
        handle.seek(0)
        # Lines the daemon wrote since the last read went into the copy: show them from there.
        with contextlib.suppress(OSError), self.rotated_path.open("rb") as copy:
            copy.seek(shown)
            for line in copy:
                self._emit(line)

    def _replaced(self, handle: BinaryIO, inode: int | None) -> bool:
        try:
            st = self.path.stat()
        except OSError:
            return True
        return st.st_ino != inode or st.st_size < handle.tell()
