"""A fast yes for the common case: a config document that config-schema.json plainly accepts.

jsonschema (with referencing, rpds and attrs) adds about 5 MiB and 50 ms to the long-running plugin
process, which checks one config per start or SIGHUP. This walker covers the keywords the schema uses
and answers True (valid), False (invalid) or None (cannot tell: an unknown keyword or a value whose
JSON meaning is not plain). Only a certain True skips jsonschema; everything else goes to the full
validator, which also words the errors. It must never accept what jsonschema rejects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from nvdp.config.schema import SchemaNode, load_schema

Verdict = bool | None

# Keywords that describe but never constrain.
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "$schema", "$id", "$defs"}
)


def verdict(doc: object, schema: SchemaNode | None = None) -> Verdict:
    """Whether `doc` satisfies the schema (config-schema.json unless given); None when it cannot tell."""
    root = load_schema() if schema is None else schema
    return _check(root, doc, root)


def plainly_valid(doc: object, schema: SchemaNode | None = None) -> bool:
    """True only when `doc` certainly satisfies the schema."""
    return verdict(doc, schema) is True


def _all(verdicts: Iterable[Verdict]) -> Verdict:
    result: Verdict = True
    for verdict in verdicts:
        if verdict is False:
            return False
        if verdict is None:
            result = None
    return result


def _json_type(value: object) -> str | None:
    # bool before int: True is an int in Python, never a number in JSON.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return None  # dates, bytes, sets from YAML tags: leave them to jsonschema


def _type(declared: object, value: object) -> Verdict:
    names = [declared] if isinstance(declared, str) else declared
    actual = _json_type(value)
    if not isinstance(names, list) or actual is None:
        return None
    if actual in names or (actual == "integer" and "number" in names):
        return True
    if actual == "number" and "integer" in names and isinstance(value, float) and value.is_integer():
        return None  # 1.0 is an integer to JSON Schema
    return False


def _scalar_equal(expected: Iterable[object], value: object) -> Verdict:
    # Only strings are compared here; numbers and booleans have JSON equality rules of their own.
    if not isinstance(value, str):
        return None
    return any(isinstance(e, str) and e == value for e in expected)


def _unique(value: list[Any]) -> Verdict:
    if not all(isinstance(item, str) for item in value):
        return None
    return len(set(value)) == len(value)


def _properties(node: SchemaNode, value: dict[Any, Any], root: SchemaNode) -> Verdict:
    if not all(isinstance(key, str) for key in value):
        return None
    props: dict[str, Any] = node.get("properties", {})
    verdicts: list[Verdict] = [_check(props[k], v, root) for k, v in value.items() if k in props]
    extra = node.get("additionalProperties", True)
    if "additionalProperties" in node:
        for key, item in value.items():
            if key in props:
                continue
            if extra is False:
                return False
            verdicts.append(_check(extra, item, root) if isinstance(extra, dict) else extra is True or None)
    return _all(verdicts)


@cache
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def _keyword(key: str, arg: Any, node: SchemaNode, value: object, root: SchemaNode) -> Verdict:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "type":
        return _type(arg, value)
    if key in ("properties", "additionalProperties"):
        return _properties(node, value, root) if isinstance(value, dict) else True
    if key == "required":
        return all(k in value for k in arg) if isinstance(value, dict) else True
    if key == "items":
        if not isinstance(value, list):
            return True
        return _all(_check(arg, item, root) for item in value) if isinstance(arg, dict) else None
    if key == "minItems":
        return len(value) >= arg if isinstance(value, list) else True
    if key == "uniqueItems":
        return _unique(value) if isinstance(value, list) and arg is True else True
    if key == "minLength":
        return len(value) >= arg if isinstance(value, str) else True
    if key == "pattern":
        return _pattern(arg).search(value) is not None if isinstance(value, str) else True
    if key == "minimum":
        return value >= arg if number else True  # type: ignore[operator]
    if key == "maximum":
        return value <= arg if number else True  # type: ignore[operator]
    if key == "enum":
        return _scalar_equal(arg, value)
    if key == "const":
        return _scalar_equal([arg], value)
    if key == "$ref":
        return (
            _check(_target(arg, root), value, root) if isinstance(arg, str) and arg.startswith("#/") else None
        )
    if key == "anyOf":
        verdicts = [_check(branch, value, root) for branch in arg]
        return True if True in verdicts else (None if None in verdicts else False)
    if key == "not":
        refused = _check(arg, value, root)
        return None if refused is None else not refused
    if key == "oneOf":
        verdicts = [_check(branch, value, root) for branch in arg]
        return None if None in verdicts else verdicts.count(True) == 1
    return None


def _target(ref: str, root: SchemaNode) -> Any:
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        if not isinstance(target, dict) or part not in target:
            return None
        target = target[part]
    return target


def _check(node: object, value: object, root: SchemaNode) -> Verdict:
    if node is True:
        return True
    if not isinstance(node, dict):
        return None
    verdicts: list[Verdict] = []
    seen_properties = False
    for key, arg in node.items():
        if key in _ANNOTATIONS:
            continue
        if key in ("properties", "additionalProperties"):
            if seen_properties:
                continue  # both are checked together
            seen_properties = True
        verdict = _keyword(key, arg, node, value, root)
        if verdict is False:
            return False
        verdicts.append(verdict)
    return _all(verdicts)
