"""A compute-mode setter that remembers calls instead of talking to NVML."""

from __future__ import annotations

from collections.abc import Iterable


class FakeModes:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def set_exclusive(self, uuids: Iterable[str]) -> None:
        self.calls.append(("EXCLUSIVE_PROCESS", list(uuids)))

    def restore(self, uuids: Iterable[str]) -> None:
        self.calls.append(("DEFAULT", list(uuids)))

    def close(self) -> None:
        self.calls.append(("close", []))
