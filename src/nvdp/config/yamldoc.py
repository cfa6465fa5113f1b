"""Read a config file's text (YAML or JSON) into a mapping, remembering the line of every key."""

from __future__ import annotations

from typing import Any

import yaml
from msgspec import Struct, field

from nvdp.config.issues import ConfigError, ConfigIssue, DocPath, format_path

MERGE_KEY = "tag:yaml.org,2002:merge"
# Aliases can make a small file describe a huge tree ("billion laughs"); real configs are tiny.
MAX_VALUES = 100_000


class ParsedDocument(Struct):
    doc: dict[Any, Any]
    # Document path -> 1-based line of its key (mapping entries) or of the item (list entries).
    lines: dict[DocPath, int] = field(default_factory=dict)


def parse_document(data: str | bytes, source: str) -> ParsedDocument:
    """Parse one YAML/JSON document. An empty document is an empty mapping (all defaults).

    Raises ConfigError for syntax errors, several documents, duplicate keys or a non-mapping top level.
    """
    try:
        loader = yaml.SafeLoader(data)
        try:
            node = loader.get_single_node()
            lines: dict[DocPath, int] = {}
            duplicates: list[ConfigIssue] = []
            if node is not None:
                memo: dict[int, int] = {}
                size = _expanded_size(node, memo)
                if size > MAX_VALUES:
                    raise ConfigError([_too_large(source, size, written=len(memo))])
                _index(node, (), lines, duplicates, source, set())
            if duplicates:
                raise ConfigError(duplicates)
            doc = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = ", ".join(part for part in (exc.context, exc.problem) if part) or "cannot be parsed"
        raise ConfigError(
            [ConfigIssue(source, "", f"not valid YAML: {problem}", line=line, fix="fix the YAML syntax")]
        ) from None
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError) as exc:
        # ReaderError (bad bytes/characters) and deep nesting carry no useful mark.
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            [ConfigIssue(source, "", f"not valid YAML: {reason}", fix="save the file as UTF-8 YAML or JSON")]
        ) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(
            [
                ConfigIssue(
                    source,
                    "",
                    f"the document must be a mapping, not a {_yaml_kind(doc)}",
                    line=1,
                    fix="start with top-level keys such as `version: v1`",
                )
            ]
        )
    return ParsedDocument(doc, lines)


def _index(
    node: yaml.Node,
    path: DocPath,
    lines: dict[DocPath, int],
    duplicates: list[ConfigIssue],
    source: str,
    visited: set[int],
) -> None:
    if id(node) in visited:
        return  # an alias: its lines were recorded where the anchor is
    visited.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_KEY or not isinstance(key_node, yaml.ScalarNode):
                # Merged anchors may legitimately repeat keys; their lines stay at the anchor.
                continue
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                duplicates.append(
                    ConfigIssue(
                        source,
                        format_path((*path, key)),
                        f"duplicate key (first set on line {seen[key]})",
                        line=line,
                        fix="keep only one of them",
                    )
                )
                continue
            seen[key] = line
            key_path: DocPath = (*path, key)
            lines[key_path] = line
            _index(value_node, key_path, lines, duplicates, source, visited)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            item_path: DocPath = (*path, i)
            lines[item_path] = item.start_mark.line + 1
            _index(item, item_path, lines, duplicates, source, visited)


def _too_large(source: str, size: int, written: int) -> ConfigIssue:
    # `written`: distinct nodes in the file. Far fewer than `size` means aliases multiplied them.
    if written * 2 <= size:
        return ConfigIssue(source, "", f"the document expands to {size} values through YAML aliases "
                           f"(more than {MAX_VALUES}; the file itself has {written})",
                           fix="use fewer YAML aliases (*name), or write the values out")
    return ConfigIssue(source, "", f"the document has {size} values (more than {MAX_VALUES}); a device "
                       "plugin config has a few dozen", fix="check that this is the intended config file "
                       "and shorten its lists")


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values the document has once every alias is expanded."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once instead of looping
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, memo) for item in node.value)
    memo[id(node)] = size
    return size


def _yaml_kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__
