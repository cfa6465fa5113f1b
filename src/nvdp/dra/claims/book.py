"""The prepared claims' records in memory, each change saved to the checkpoint before it is relied on.

Every write goes through `put` or `drop`, which replace the checkpoint file atomically and durably
(nvdp.dra.claims.checkpoint) before returning, so an intent recorded here is on disk before the side
effect it announces.

The node-wide lock (`node_lock`) is held around every change: a thread lock for this process and an
`flock` on a file in the plugin's folder, so a second plugin instance (a rolling update) waits its
turn. Waiting longer than the kubelet would is answered with TimeoutError, which the kubelet retries.
Whoever takes the lock first asks `changed_elsewhere`: the file is not the one this instance last read
or wrote (another instance saved since), and `reload` reads it again, so the checkpoint has one writer at
a time and each writer starts from the last one's records.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator

from nvdp.dra.claims.checkpoint import Loaded, load_checkpoint, save_checkpoint
from nvdp.dra.claims.records import ClaimEntry


class ClaimBook:
    def __init__(self, path: str) -> None:
        self.path = path
        self._claims: dict[str, ClaimEntry] = {}
        self._seen: tuple[int, int, int] | None = None  # the file as this instance last read or wrote it
        self._loaded = False  # before the start's load, the start decides what the file means

    def load(self) -> Loaded:
        loaded = load_checkpoint(self.path)
        self._claims = dict(loaded.claims)
        self._seen = self._identity()
        self._loaded = True
        return loaded

    def changed_elsewhere(self) -> bool:
        """Whether another process saved the checkpoint since this instance last read or wrote it
        (every save replaces the file, so its inode, time and size say so)."""
        return self._loaded and self._identity() != self._seen

    def reload(self) -> tuple[set[str], set[str]]:
        """Read the checkpoint again; the claims it added and those it dropped."""
        before = set(self._claims)
        self.load()
        after = set(self._claims)
        return after - before, before - after

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (found.st_ino, found.st_mtime_ns, found.st_size)

    def get(self, uid: str) -> ClaimEntry | None:
        return self._claims.get(uid)

    def __getitem__(self, uid: str) -> ClaimEntry:
        return self._claims[uid]

    def __contains__(self, uid: object) -> bool:
        return uid in self._claims

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._claims))

    def entries(self) -> dict[str, ClaimEntry]:
        return dict(self._claims)

    def others(self, uid: str) -> list[ClaimEntry]:
        return [e for u, e in self._claims.items() if u != uid]

    def put(self, entry: ClaimEntry) -> None:
        self._claims[entry.uid] = entry
        self.save()

    def drop(self, uid: str) -> None:
        if self._claims.pop(uid, None) is not None:
            self.save()

    def saver(self, uid: str) -> SaveEntry:
        return SaveEntry(self, uid)

    def save(self) -> None:
        save_checkpoint(self.path, self._claims)
        self._seen = self._identity()


class SaveEntry:
    """Saves one claim's entry as it stands (None: drops it); nvdp.dra.claims.undo.Save."""

    def __init__(self, book: ClaimBook, uid: str) -> None:
        self._book = book
        self._uid = uid

    def __call__(self, entry: ClaimEntry | None) -> None:
        if entry is None:
            self._book.drop(self._uid)
        else:
            self._book.put(entry)


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
