"""The prepared claims' records in memory, each change saved to the checkpoint before it is relied on.

Every write goes through `put` or `drop`, which replace the checkpoint file atomically and durably
(nvdp.dra.claims.checkpoint) before returning, so an intent recorded here is on disk before the side
effect it announces.
"""

from __future__ import annotations

from collections.abc import Iterator

from nvdp.dra.claims.checkpoint import Loaded, load_checkpoint, save_checkpoint
from nvdp.dra.claims.records import ClaimEntry


class ClaimBook:
    def __init__(self, path: str) -> None:
        self.path = path
        self._claims: dict[str, ClaimEntry] = {}

    def load(self) -> Loaded:
        loaded = load_checkpoint(self.path)
        self._claims = dict(loaded.claims)
        return loaded

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
