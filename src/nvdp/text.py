"""Wording shared by log lines, Event messages and errors; pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


def columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A table's lines: left-aligned columns two spaces apart under an upper-case header, no trailing
    spaces."""
    cells = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
