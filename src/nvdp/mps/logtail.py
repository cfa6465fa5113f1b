"""Follow a daemon's control.log into our own log, each line prefixed with the resource name."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import BinaryIO

POLL_S = 0.2


class LogTail:
    def __init__(self, path: Path, prefix: str, log: logging.Logger, skip: str = "") -> None:
        self.path = path
        self.prefix = prefix
        self.log = log
        # Lines containing `skip` are left out: the daemon logs every health probe we send it.
        self.skip = skip
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"tail {self.prefix}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
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
                        text = line.decode("utf-8", "replace").rstrip("\n")
                        if not (self.skip and self.skip in text):
                            self.log.info("[%s] %s", self.prefix, text)
                    if self._replaced(handle, inode):
                        handle.close()
                        handle = None
                        continue
                if stopping:
                    return
                # One more pass after stop(), so the daemon's last words (after `quit`) are shown.
                stopping = self._stop.wait(POLL_S)
        finally:
            if handle is not None:
                handle.close()

    def _open(self) -> tuple[BinaryIO | None, int | None]:
        try:
            handle = self.path.open("rb")
        except OSError:
            return None, None
        return handle, os.fstat(handle.fileno()).st_ino

    def _replaced(self, handle: BinaryIO, inode: int | None) -> bool:
        try:
            st = self.path.stat()
        except OSError:
            return True
        return st.st_ino != inode or st.st_size < handle.tell()
