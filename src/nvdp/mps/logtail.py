"""Follow a daemon's control.log into our own log, each line prefixed with the resource name.

The tail starts at the end of what the file already holds: the MPS root outlives daemon pods, and
an earlier pod's lines (its "Control daemon exiting" with old timestamps) are not news. The file
sits on the node's /run (tmpfs, RAM) and the daemon appends a line for every command, health
probes included, so the tail also bounds it: past `max_bytes` of lines shown since the last
rotation, those lines are copied to control.log.1 (replacing the previous copy) and their space is
freed in place, a hole punched over them (fallocate PUNCH_HOLE, KEEP_SIZE).

Why not copy and truncate: the daemon appends (O_APPEND, whether it holds the file open or opens it
for each line), and a line appended between the copy and the truncate would be in neither; under a
burst that lost a tenth of the lines. The hole covers only what was already read, so the kernel
frees it without touching a line written meanwhile: every line is shown, and the last rotated ones
are kept in control.log.1. The file's size still counts the freed part (`ls -l` grows, `du` does
not), and reading it from the start gives zero bytes for the freed part; `tail` reads it as before.
A filesystem that cannot punch holes is not rotated at all (a warning says so): a line is never
dropped to bound the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, cast

POLL_S = 0.2
MAX_BYTES_ENV = "MPS_CONTROL_LOG_MAX_BYTES"
DEFAULT_MAX_BYTES = 1024 * 1024
ROTATED_SUFFIX = ".1"
ERROR_PAUSE_S = 5.0
COPY_CHUNK = 64 * 1024
# <linux/falloc.h>
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


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
        # Where the lines not yet rotated begin in the open file: all before it is a freed hole.
        self._kept_from = 0

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
                    lines: list[bytes] = []
                    while line := handle.readline():
                        if not line.endswith(b"\n"):
                            # A line still being written: read it again whole on the next pass.
                            handle.seek(-len(line), os.SEEK_CUR)
                            break
                        lines.append(line)
                    if self._replaced(handle, inode):
                        self._emit_all(lines)
                        handle.close()
                        handle = None
                        continue
                    self._emit_all(lines)
                    if handle.tell() - self._kept_from >= self.max_bytes:
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
        # What an earlier rotation freed reads as zero bytes: never shown, never copied.
        self._kept_from = data_start(handle.fileno())
        handle.seek(self._kept_from)
        if self._old is not None:
            old_inode, old_size = self._old
            self._old = None
            if inode == old_inode:
                handle.seek(max(old_size, self._kept_from))
        return handle, inode

    def _emit(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\n")
        if not (self.skip and self.skip in text):
            self.log.info("[%s] %s", self.prefix, text)

    def _emit_all(self, lines: list[bytes]) -> None:
        for line in lines:
            self._emit(line)

    def _rotate(self, handle: BinaryIO) -> None:
        """Copy the lines shown since the last rotation to control.log.1 and free their space."""
        fd = handle.fileno()
        start, shown = self._kept_from, handle.tell()
        try:
            # Copied beside it and renamed into place, so control.log.1 is never seen half written.
            partial = self.rotated_path.with_name(self.rotated_path.name + ".tmp")
            with partial.open("wb") as copy:
                offset = start
                while offset < shown and (chunk := os.pread(fd, min(COPY_CHUNK, shown - offset), offset)):
                    copy.write(chunk)
                    offset += len(chunk)
            os.replace(partial, self.rotated_path)
            punch_hole(self.path, os.fstat(fd).st_ino, shown)
        except OSError as err:
            self.log.warning(
                "[%s] cannot rotate %s: %s; it keeps growing, no line is dropped", self.prefix, self.path, err
            )
            # Not again for every poll: only after another max_bytes.
            self.max_bytes = shown - start + self.max_bytes
            return
        self._kept_from = shown

    def _replaced(self, handle: BinaryIO, inode: int | None) -> bool:
        try:
            st = self.path.stat()
        except OSError:
            return True
        return st.st_ino != inode or st.st_size < handle.tell()


def data_start(fd: int) -> int:
    """The first offset holding data: past the hole earlier rotations punched (the size if all is a hole)."""
    try:
        return os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as err:
        if err.errno == errno.ENXIO:  # nothing but a hole
            return os.fstat(fd).st_size
        return 0  # SEEK_DATA not supported: no holes either


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int]:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fallocate = libc.fallocate
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    fallocate.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", fallocate)


def punch_hole(path: Path, inode: int, end: int) -> None:
    """Free the first `end` bytes of `path` (if it still is `inode`) in place; its size and every byte
    past `end` stay as they are."""
    if end <= 0:
        return
    # Opened for writing (fallocate needs it), without O_APPEND, O_TRUNC or O_CREAT.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino != inode:
            return  # replaced meanwhile: the next pass follows the new file
        if _fallocate()(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, end) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"cannot free the lines already read: {os.strerror(code)}")
    finally:
        os.close(fd)
