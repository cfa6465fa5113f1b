"""A daemon's side of the per-node mode: the gate in force and the wait for the other API to let go.

The device plugin entering "device-plugin" mode waits until the DRA plugin's ResourceSlices for the
node are gone; the DRA plugin entering "dra" mode waits until the Node's allocatable shows none of the
device plugin's resources (nvdp.daemon.pernode.mode). `ModeHandover` is that state machine for either daemon:
`enter` (from the daemon's `switch`, after `ModeGate.check`) says whether the daemon must hold back,
`poll` (from its loop) whether the wait just ended, and `advertising` records ModeSwitched once the
daemon advertises. The daemon supplies only what it waits for (`Waits`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nvdp.config.model import Mode
from nvdp.daemon.pernode.mode import Handover, ModeGate, NodeApi

# What a daemon entering its mode waits for: (what, a look that says what is still held, or None),
# or None when there is nothing to wait for (no API access, no other API deployed).
Waits = Callable[[NodeApi], "tuple[str, Callable[[], str | None]] | None"]


class ModeHandover:
    """The mode in force (`gate`) and, while it lasts, the wait for the other API (`waiting`)."""

    def __init__(self, gate: ModeGate, waits: Waits, log: logging.Logger) -> None:
        self.gate = gate
        self._waits = waits
        self._log = log
        self.handover: Handover | None = None

    @property
    def mode(self) -> Mode | None:
        return self.gate.mode

    @property
    def waiting(self) -> bool:
        return self.handover is not None

    def enter(self, mode: Mode, *, entering: bool | None = None) -> bool:
        """`mode` goes in force (after `gate.check`); returns whether the daemon must hold back.

        `entering`: whether to look for the other API again (default: the mode changes, or a wait
        goes on, so a reload while waiting keeps waiting).
        """
        switching = self.gate.mode != mode
        self.gate.enter(mode)
        if mode != self.gate.own:
            self.handover = None
            return False
        look = (switching if entering is None else entering) or self.handover is not None
        self.handover = None
        api = self.gate.api
        if not look or api is None:
            return False
        wait = self._waits(api)
        if wait is None:
            return False
        what, held = wait
        handover = Handover(what, held, self._log)
        if handover.done():
            return False
        self.handover = handover
        return True

    def poll(self) -> bool:
        """Look once while waiting; True when the other API has just let go."""
        if self.handover is None or not self.handover.done():
            return False
        self.handover = None
        return True

    def advertising(self) -> None:
        """The daemon advertises in its mode now (ModeSwitched, once, if a switch led here)."""
        self.gate.advertising()
