"""Wording shared by log lines, Event messages and errors; pure functions."""

from __future__ import annotations

from collections.abc import Iterable

SHOWN = 4


def short_list(items: Iterable[str], limit: int = SHOWN, total: int | None = None) -> str:
    """The first `limit` items and how many more ("a, b, c, d and 3 more"): bounded, whatever the input.

    `total`: how many there are, when `items` holds only the first ones (so that a caller with
    thousands need not word them all).
    """
    listed = list(items)
    shown = ", ".join(listed[:limit])
    rest = (len(listed) if total is None else total) - min(limit, len(listed))
    return f"{shown} and {rest} more" if rest > 0 else shown
