"""Polling helper: tests wait for a state, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable

# Generous: the limit only matters when something is broken, and then the assert names it.
LIMIT_S = 20.0


def wait_for(condition: Callable[[], bool], limit_s: float = LIMIT_S, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + limit_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)
