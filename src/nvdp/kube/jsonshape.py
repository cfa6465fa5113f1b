"""The outline of a JSON document, read without recursion: where its top-level parts are, how deep it nests.

A JSON decoder recurses once per nested object or array and gives up past its limit (msgspec at about
a thousand levels), failing the whole document. The API server stores far deeper objects (opaque
claim parameters are free-form JSON), so one such object in a list would fail the list. This scanner
walks the tokens with its own stack, so callers can cut a list into its items, decode each on its own
and name the field of one that nests too deeply.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import Struct

# A string (escapes included), or one of the characters that shape the document; numbers, literals
# and white space between them are skipped: the decoder checks those once a part is cut out.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},]')
_OPEN = {ord("{"): ord("}"), ord("["): ord("]")}
_QUOTE, _COMMA = ord('"'), ord(",")

Path = tuple[str | int, ...]


class NotJson(ValueError):
    """The brackets do not balance: the document is not JSON."""


class Outline(Struct, frozen=True):
    """The root's members (an object) or elements (an array) that are objects or arrays, as byte spans
    [start, end); and, when the document nests deeper than the limit, the path to the first object or
    array past it (keys and array indices from the root)."""

    members: dict[str, tuple[int, int]]
    elements: list[tuple[int, int]]
    too_deep_at: Path | None = None


def outline(raw: bytes, limit: int) -> Outline:
    """The outline of `raw`; the root object or array is at depth 1. NotJson when unbalanced."""
    # Per open object or array: its closing character, its key or index now, where it started.
    stack: list[list[int | bytes | None]] = []
    expect_key = False
    members: dict[str, tuple[int, int]] = {}
    elements: list[tuple[int, int]] = []
    too_deep_at: Path | None = None
    for match in _TOKEN.finditer(raw):
        first = raw[match.start()]
        if first == _QUOTE:
            if expect_key:
                stack[-1][1] = match.group()
                expect_key = False
        elif first == _COMMA:
            if not stack:
                raise NotJson("a comma outside any object or array")
            top = stack[-1]
            if top[0] == ord("}"):
                expect_key = True
            else:
                assert isinstance(top[1], int)
                top[1] += 1
        elif first in _OPEN:
            if len(stack) >= limit and too_deep_at is None:
                too_deep_at = _path(stack)
            is_object = first == ord("{")
            stack.append([_OPEN[first], None if is_object else 0, match.start()])
            expect_key = is_object
        else:
            if not stack or stack[-1][0] != first:
                raise NotJson(f"an unmatched {chr(first)!r} at byte {match.start()}")
            _closing, _key, start = stack.pop()
            expect_key = False
            if len(stack) == 1:
                assert isinstance(start, int)
                span = (start, match.end())
                parent = stack[0]
                if parent[0] == ord("}") and isinstance(parent[1], bytes):
                    members[_key_text(parent[1])] = span
                elif parent[0] == ord("]"):
                    elements.append(span)
    if stack:
        raise NotJson("the document ends inside an object or array")
    return Outline(members=members, elements=elements, too_deep_at=too_deep_at)


def _key_text(token: bytes) -> str:
    try:
        return str(msgspec.json.decode(token))
    except msgspec.DecodeError:
        return token.decode("utf-8", "replace")


def _path(stack: list[list[int | bytes | None]]) -> Path:
    path: list[str | int] = []
    for _closing, key, _start in stack:
        if isinstance(key, bytes):
            path.append(_key_text(key))
        elif isinstance(key, int):
            path.append(key)
    return tuple(path)


def field_name(path: Path) -> str:
    """`spec.devices.config[0].opaque.parameters` for ("spec", "devices", "config", 0, "opaque", ...)."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
