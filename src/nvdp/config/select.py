"""Which config entry a node gets: NVIDIA's config-manager order, as a pure function.

1. the node label `nvidia.com/device-plugin.config`, if set (non-empty): that entry, which must exist;
2. else `config.default` (DEFAULT_CONFIG), which must exist;
3. else the fallback strategies in order: `named` the entry called `default`, `single` the only
   entry, `empty` no config file at all.
Entries are the files of the mounted ConfigMap directory (see entries.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from msgspec import Struct

NODE_CONFIG_LABEL = "nvidia.com/device-plugin.config"
FALLBACK_STRATEGIES = ("named", "single", "empty")
DEFAULT_FALLBACKS = ("named", "single")


class SelectionError(Exception):
    """No entry can be selected; the message names the cause, the entries there are and the fix."""


class UnknownEntry(SelectionError):
    """The node label or config.default names an entry that does not exist."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class Selection(Struct, frozen=True):
    """The chosen entry (None: run without a config file) and what chose it."""

    entry: str | None
    reason: str  # "label", "config.default", "fallback named", "fallback single", "fallback empty"

    def describe(self) -> str:
        entry = f"entry {self.entry!r}" if self.entry is not None else "no config file"
        return f"{entry} (from {self.reason})"


def listed(entries: Collection[str]) -> str:
    return ", ".join(sorted(entries)) if entries else "none"


def parse_fallbacks(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """`named,single` (the FALLBACK_STRATEGIES form) or a list; unknown names are an error."""
    if text is None:
        return DEFAULT_FALLBACKS
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else [s.strip() for s in text]
    items = [s for s in items if s]
    unknown = [s for s in items if s not in FALLBACK_STRATEGIES]
    if unknown:
        raise SelectionError(f"unknown fallback strategy: {', '.join(unknown)} "
                             f"(known: {', '.join(FALLBACK_STRATEGIES)}); fix FALLBACK_STRATEGIES / "
                             "config.fallbackStrategies")
    return tuple(items)


def select_entry(entries: Collection[str], label: str | None, default: str | None,
                 fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
                 label_name: str = NODE_CONFIG_LABEL) -> Selection:
    """The entry for a node with label value `label` (None or "" when unset); raises SelectionError."""
    if label:
        if label not in entries:
            raise UnknownEntry(
                f"node label {label_name}={label} names config {label!r}, which does not exist "
                f"(entries: {listed(entries)}); label the node with one of them or add the entry", label)
        return Selection(label, "label")
    if default:
        if default not in entries:
            raise UnknownEntry(
                f"config.default (DEFAULT_CONFIG) names config {default!r}, which does not exist "
                f"(entries: {listed(entries)}); set it to one of them", default)
        return Selection(default, "config.default")
    for strategy in fallbacks:
        if strategy == "named" and "default" in entries:
            return Selection("default", "fallback named")
        if strategy == "single" and len(entries) == 1:
            return Selection(next(iter(entries)), "fallback single")
        if strategy == "empty":
            return Selection(None, "fallback empty")
        if strategy not in FALLBACK_STRATEGIES:
            raise SelectionError(f"unknown fallback strategy: {strategy}")
    raise SelectionError(
        f"no config was set, no default was provided, and all fallbacks failed (entries: {listed(entries)}; "
        f"fallbacks tried: {', '.join(fallbacks) or 'none'}); label the node {label_name}=<entry>, "
        "set config.default, or add \"empty\" to config.fallbackStrategies")


def select_for_labels(entries: Collection[str], labels: Mapping[str, str] | None, default: str | None,
                      fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
                      label_name: str = NODE_CONFIG_LABEL) -> Selection:
    return select_entry(entries, (labels or {}).get(label_name), default, fallbacks, label_name)
