"""The metrics of the kubelet's calls into the DRA plugin: NVIDIA's nvidia_dra_* series, per claim.

As NVIDIA's driver counts them: the claims in flight while their call is answered; each claim that
succeeded a request, timed with its call's time (the kubelet sends a pod's claims in one call, and
they are prepared one after the other under one lock); each claim that failed counted under its cause
(a closed set of words, nvdp.dra.claims.causes); and after each call the devices prepared now, by kind (a
device shared by several claims counts once for each). Recorded through the process's Recorder, so
nothing is imported or kept while metrics are off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from nvdp.daemon.report.recording import Recorder
from nvdp.dra.pool.names import device_kind

PREPARE, UNPREPARE = "prepare", "unprepare"  # NVIDIA's `operation` label values
DEVICE_KINDS = ("gpu", "mig")  # always exported, at 0 when none is prepared


class NamedDevice(Protocol):
    @property
    def device(self) -> str: ...


class PreparedClaim(Protocol):
    """A claim prepared on this node, as the preparer lists them (nvdp.dra.claims.checkpoint.ClaimEntry)."""

    @property
    def devices(self) -> Sequence[NamedDevice]: ...


Prepared = Callable[[], Mapping[str, PreparedClaim]]  # the claims prepared now, by uid


def prepared_by_kind(claims: Mapping[str, PreparedClaim]) -> dict[str, int]:
    """Devices per kind, each device once per claim (a claim lists a device once per request)."""
    counts = dict.fromkeys(DEVICE_KINDS, 0)
    for claim in claims.values():
        for name in {d.device for d in claim.devices}:
            kind = device_kind(name)
            counts[kind] = counts.get(kind, 0) + 1
    return counts


class Meter:
    """One DRA server's calls, recorded for `driver` on `node`."""

    def __init__(self, recorder: Recorder, driver: str, node: str, prepared: Prepared | None) -> None:
        self._recorder = recorder
        self._driver = driver
        self._node = node
        self._prepared = prepared
        self._kinds: set[str] = set()  # every kind exported so far: one no longer prepared reads 0

    def serving(self) -> None:
        """The server is up: its series exist from now on, the claims prepared before a restart counted."""
        self._recorder.dra_serving(self._driver, (PREPARE, UNPREPARE))
        self.prepared_devices()

    def begin(self, operation: str, claims: int) -> float:
        self._recorder.dra_in_flight(self._driver, operation, claims)
        return time.monotonic()

    def end(self, operation: str, started: float, causes: Sequence[str]) -> None:
        """The call that `begin` started is answered: each claim's cause, "" for a success."""
        seconds = time.monotonic() - started
        # The devices first: a scrape that sees the request counted sees what it prepared or released.
        self.prepared_devices()
        self._recorder.dra_in_flight(self._driver, operation, -len(causes))
        self._recorder.dra_answered(self._driver, operation, seconds, causes)

    def prepared_devices(self) -> None:
        if self._prepared is None or not self._recorder.metrics_enabled:
            return
        counts = prepared_by_kind(self._prepared())
        self._kinds.update(counts)
        every = {kind: counts.get(kind, 0) for kind in self._kinds}
        self._recorder.dra_prepared(self._node, self._driver, every)
