"""Configuration problems: each names where it came from, where in the document, and how to fix it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from msgspec import Struct

PathPart = str | int
DocPath = tuple[PathPart, ...]


def format_path(parts: Iterable[PathPart]) -> str:
    """`("sharing", "mps", "resources", 0, "replicas")` -> `sharing.mps.resources[0].replicas`."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


class ConfigIssue(Struct, frozen=True):
    """One problem with the configuration.

    `source` is a file path, an environment variable name or a command-line flag;
    `path` the dotted place in the config document (empty for the whole document);
    `value` the offending value as written (None when there is none, e.g. a missing key);
    `fix` what would be valid.
    """

    source: str
    path: str
    message: str
    line: int | None = None
    value: str | None = None
    fix: str | None = None

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        text = f"{where}: {self.path or '(document)'}: {self.message}"
        if self.value is not None:
            text += f" (got {self.value})"
        if self.fix:
            text += f"; {self.fix}"
        return text


class ConfigError(Exception):
    """The configuration is unusable; `issues` lists every problem found, in document order."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        if not issues:
            raise ValueError("ConfigError needs at least one issue")
        self.issues: list[ConfigIssue] = list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.issues)
        head = f"invalid configuration ({count} problem{'s' if count != 1 else ''}):"
        return "\n".join([head, *(f"  {issue}" for issue in self.issues)])


def show_value(value: object, limit: int = 80) -> str:
    """A value as the user would recognise it from YAML, cut short when long."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, str):
        text = repr(value)
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
