"""The one undo of a claim: everything its record says it did, released newest first.

Used alike by a failed prepare, the kubelet's unprepare, the start's replay of a claim left half
prepared or half released, and the release of a claim proven gone. The entry is marked `Releasing`
before the first effect is undone, and each MIG step leaves the record once what it made is gone,
so a kill during the undo leaves a record the next start finishes. Order: the CDI spec first (no
container can start with a device that is going away), then the claim's sharing (its MPS share and
time slices, found by the claim's UID), then the MIG devices, newest first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from msgspec.structs import replace

from nvdp.dra.claims.mig import ClaimInstances, same_effect
from nvdp.dra.claims.records import RELEASING, ClaimEntry, MigDeviceStep, Step, owned_mig

# Stores the claim's entry as it now stands (None: the claim is gone from the record), durably.
Save = Callable[[ClaimEntry | None], None]


class SpecFiles(Protocol):
    def remove(self, claim_uid: str) -> None: ...


class Shares(Protocol):
    def release(self, claim_uid: str) -> None: ...


class ClaimUndo:
    def __init__(self, instances: ClaimInstances, specs: SpecFiles, sharing: Shares,
                 log: logging.Logger) -> None:
        self._instances = instances
        self._specs = specs
        self._sharing = sharing
        self._log = log

    def __call__(self, entry: ClaimEntry, save: Save, others: Iterable[ClaimEntry]) -> str:
        """Undo what `entry`'s claim did; "" when all of it is undone (the entry is then dropped), else
        what is left and why (the entry stays `Releasing` with the steps not yet undone, and the next
        undo of it, the kubelet's retry or a start, goes on from there). `others`: the other claims'
        entries, whose MIG devices are never taken for this claim's."""
        if entry.state != RELEASING:
            entry = replace(entry, state=RELEASING)
            save(entry)
        try:
            self._specs.remove(entry.uid)
        except Exception as err:
            return f"cannot remove the CDI spec: {err}"
        self._sharing.release(entry.uid)
        theirs = owned_mig(others).uuids
        left: list[str] = []
        for step in reversed(entry.steps):
            def record(changed: Step) -> None:
                nonlocal entry
                entry = replace(entry, steps=tuple(changed if same_effect(s, changed) else s
                                                   for s in entry.steps))
                save(entry)

            problem = self._instances.undo_step(step, theirs, record)
            if problem:
                left.append(problem)
                continue
            entry = replace(entry, steps=tuple(s for s in entry.steps if not same_effect(s, step)))
            if isinstance(step, MigDeviceStep):
                save(entry)
        if left:
            save(entry)
            return "; ".join(left)
        save(None)
        return ""
