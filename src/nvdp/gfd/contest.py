"""Pace the writes that undo someone else's change to our labels (pure; the clock is passed in).

Two labellers on one node with different label sets (a rolling update of the DaemonSet with a new
config, or a second install) would each restore their own set as soon as they see the other's, and
write the Node hundreds of times a minute. A write that sets a key to the value this labeller wrote
last (so someone else has changed it since) is contested: the first goes out at once (a person fixed
a label by hand), the next ones wait with exponential back-off, and a run of them is reported as the
fight it is. After a quiet spell the back-off starts over.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from nvdp.gfd.labels import TIMESTAMP
from nvdp.text import short_list

log = logging.getLogger("nvdp.gfd")

# Contested writes: the wait after the first one, doubling up to the most (seconds).
CONTESTED_BACKOFF_S = (1.0, 60.0)
# This many contested writes in a row (no quiet spell between) make a WARNING: one is a person.
FIGHT_AFTER = 3


class ContestedWrites:
    """What this labeller last wrote per key, and when the next contested write may go out."""

    def __init__(self, node_name: str, backoff_s: tuple[float, float] = CONTESTED_BACKOFF_S) -> None:
        self.node_name = node_name
        self.initial_s, self.maximum_s = backoff_s
        self._written: dict[str, str | None] = {}
        self._delay = self.initial_s
        self._next_at = -math.inf
        self._last_at = -math.inf
        self._in_a_row = 0
        self._first_at = 0.0

    def contested(self, changes: Mapping[str, str | None]) -> list[str]:
        """The keys `changes` would set back to what this labeller wrote last (the timestamp aside)."""
        return sorted(k for k, v in changes.items()
                      if k != TIMESTAMP and k in self._written and self._written[k] == v)  # fmt: skip

    def wait_s(self, now: float) -> float:
        """Seconds until a contested write may go out (0: now)."""
        if now - self._last_at > 2 * self.maximum_s:  # quiet for a while: start over
            self._delay, self._next_at, self._in_a_row = self.initial_s, -math.inf, 0
        return max(self._next_at - now, 0.0)

    def wrote(self, changes: Mapping[str, str | None], contested: list[str], now: float) -> None:
        """Record a write that went out; `contested` as `contested(changes)` said before it."""
        self._written.update(changes)
        if not contested:
            return
        if self._in_a_row == 0:
            self._first_at = now
        self._in_a_row += 1
        self._last_at = now
        self._next_at = now + self._delay
        if self._in_a_row == 1:
            log.info("node %s: restoring labels someone else changed: %s", self.node_name,
                     short_list(contested))
        elif self._in_a_row == FIGHT_AFTER:
            log.warning(
                "node %s: labels %s keep being changed by someone else (%d times in %.0f s): another "
                "labeller is probably writing this node, e.g. two gpu-feature-discovery pods with "
                "different configs during a rolling update, or a second install; writing them at most "
                "every %.0f s, doubling up to %.0f s, until it stops",
                self.node_name, short_list(contested), self._in_a_row, now - self._first_at, self._delay,
                self.maximum_s,
            )  # fmt: skip
        else:
            log.debug("node %s: contested write %d; the next one waits %.1f s", self.node_name,
                      self._in_a_row, self._delay)  # fmt: skip
        self._delay = min(self._delay * 2, self.maximum_s)
