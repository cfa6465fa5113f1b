"""The config file's JSON Schema (config-schema.json, packaged with nvdp) and questions asked of it.

Every structural rule lives in the schema; Python only walks it (key paths for suggestions,
the type a text value from the environment should become, camelCase names for output).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

SchemaNode = dict[str, Any]
SCHEMA_FILE = "config-schema.json"


@cache
def load_schema() -> SchemaNode:
    # Beside this module in the source tree and in the wheel; importlib.resources would pull in
    # zipfile, tempfile and shutil for a plain file.
    text = Path(__file__).with_name(SCHEMA_FILE).read_text(encoding="utf-8")
    schema: SchemaNode = json.loads(text)
    return schema


@cache
def validator() -> Draft202012Validator:
    # Imported on first use: a valid config never needs it (see quickcheck).
    from jsonschema import Draft202012Validator

    return Draft202012Validator(load_schema())


def resolve(node: SchemaNode) -> SchemaNode:
    """Inline a local `$ref`, letting keywords written beside it (defaults, titles) win."""
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    target: Any = load_schema()
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    merged: SchemaNode = dict(resolve(target))
    for key, value in node.items():
        if key == "$ref":
            continue
        if key == "properties" and "properties" in merged:
            props = dict(merged["properties"])
            for name, sub in value.items():
                props[name] = {**props.get(name, {}), **sub}
            merged["properties"] = props
        else:
            merged[key] = value
    return merged


def alternatives(node: SchemaNode) -> list[SchemaNode]:
    """The node itself, or each branch of its oneOf/anyOf, resolved."""
    node = resolve(node)
    branches = node.get("oneOf") or node.get("anyOf")
    if not branches:
        return [node]
    return [resolve(b) for b in branches]


def child(node: SchemaNode, part: str | int) -> SchemaNode | None:
    """The schema of `part` (a key or a list index) inside a value described by `node`."""
    for alt in alternatives(node):
        if isinstance(part, int):
            items = alt.get("items")
            if isinstance(items, dict):
                return resolve(items)
        else:
            props = alt.get("properties", {})
            if part in props:
                return resolve(props[part])
    return None


def node_at(path: Sequence[str | int]) -> SchemaNode | None:
    node: SchemaNode | None = resolve(load_schema())
    for part in path:
        if node is None:
            return None
        node = child(node, part)
    return node


def accepted_types(node: SchemaNode) -> set[str]:
    types: set[str] = set()
    for alt in alternatives(node):
        declared = alt.get("type")
        if isinstance(declared, str):
            types.add(declared)
        elif isinstance(declared, list):
            types.update(declared)
    return types


def key_paths() -> list[tuple[str, ...]]:
    """Every key the schema knows, as a path; list items appear as "[]"."""
    found: list[tuple[str, ...]] = []

    def walk(node: SchemaNode, prefix: tuple[str, ...]) -> None:
        for alt in alternatives(node):
            for name, sub in alt.get("properties", {}).items():
                path = (*prefix, name)
                if path not in found:
                    found.append(path)
                walk(resolve(sub), path)
            items = alt.get("items")
            if isinstance(items, dict) and prefix:
                walk(resolve(items), (*prefix, "[]"))

    walk(resolve(load_schema()), ())
    return found


def show_key_path(path: Sequence[str]) -> str:
    return "".join(p if p == "[]" else (f".{p}" if i else p) for i, p in enumerate(path))


def object_properties(node: SchemaNode) -> dict[str, SchemaNode]:
    props: dict[str, SchemaNode] = {}
    for alt in alternatives(node):
        for name, sub in alt.get("properties", {}).items():
            props[name] = resolve(sub)
    return props


# An acronym (with an optional plural "s": channelIDs), a capitalised word, or a lone capital run.
_WORD = re.compile(r"[A-Z]{2,}s?(?![a-z])|[A-Z]?[a-z0-9]+|[A-Z]+")


def snake_case(name: str) -> str:
    """`deviceIDStrategy` -> `device_id_strategy`: how model.py names the config file's keys."""
    return "_".join(word.lower() for word in _WORD.findall(name))


def iter_defaults(
    node: SchemaNode | None = None, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, default) for every leaf that declares a default; objects are walked, not reported."""
    node = resolve(load_schema()) if node is None else node
    for name, sub in object_properties(node).items():
        path = (*prefix, name)
        if "object" in accepted_types(sub) and object_properties(sub):
            yield from iter_defaults(sub, path)
        elif "default" in sub:
            yield path, sub["default"]
