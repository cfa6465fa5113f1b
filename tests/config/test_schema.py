"""config-schema.json: well-formed, documented, packaged, and in step with model.py."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from msgspec import Struct
from msgspec.structs import fields

from nvdp.config import model
from nvdp.config.document import config_to_document
from nvdp.config.loader import load_config_text
from nvdp.config.model import Config, ReplicatedResources
from nvdp.config.schema import (
    SchemaNode,
    accepted_types,
    iter_defaults,
    load_schema,
    node_at,
    object_properties,
    resolve,
    snake_case,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "config-schema.json"
# Not part of the file: where the values came from.
NOT_IN_FILE = {(Config, "source")}


def walk(node: Any) -> typing.Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def test_schema_is_valid_2020_12() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_packaged_schema_is_the_root_file() -> None:
    link = ROOT / "src" / "nvdp" / "config" / "config-schema.json"
    assert link.is_symlink()
    assert not Path(str(link.readlink())).is_absolute()
    assert link.resolve() == SCHEMA_PATH
    assert load_schema() == json.loads(SCHEMA_PATH.read_text())


def test_every_object_is_closed_and_every_property_documented() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    for node in walk(schema):
        if "properties" in node and "$ref" not in node:
            assert node.get("additionalProperties") is False, sorted(node["properties"])
            for name, prop in node["properties"].items():
                assert prop.get("title"), name
                assert prop.get("description"), name


def record_of(hint: Any) -> type | None:
    """The record type (a Struct) in `X`, `X | None` or `tuple[X, ...]`."""
    if isinstance(hint, type) and issubclass(hint, Struct):
        return hint
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType, tuple):
        for arg in typing.get_args(hint):
            found = record_of(arg)
            if found is not None:
                return found
    return None


def compare(cls: type, node: SchemaNode, where: str) -> list[str]:
    problems = []
    hints = typing.get_type_hints(cls, vars(model))
    props = {snake_case(k): k for k in object_properties(node)}
    names = {f.name for f in fields(cls) if (cls, f.name) not in NOT_IN_FILE}
    problems += [
        f"{where}: schema key {props[n]} has no field in {cls.__name__}" for n in props.keys() - names
    ]
    problems += [f"{where}: {cls.__name__}.{n} is not in the schema" for n in names - props.keys()]
    for name in names & props.keys():
        sub = resolve(object_properties(node)[props[name]])
        inner = record_of(hints[name])
        if inner is None or inner is model.DeviceSelection:
            continue
        if "array" in accepted_types(sub):
            sub = resolve(sub["items"])
        problems += compare(inner, sub, f"{where}.{props[name]}")
    return problems


def test_schema_and_model_have_the_same_fields() -> None:
    assert compare(Config, resolve(load_schema()), "") == []


def at(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def test_schema_defaults_match_model_defaults() -> None:
    defaults_doc = config_to_document(Config())
    checked = 0
    for path, default in iter_defaults():
        if path[0] == "sharing":
            continue  # no sharing block by default; checked below
        assert at(defaults_doc, path) == default, path
        checked += 1
    assert checked == 38  # every leaf of flags, resources, imex and version


def test_every_default_field_has_a_schema_default() -> None:
    with_default = {path for path, _ in iter_defaults()}

    def leaves(doc: dict[str, Any], prefix: tuple[str, ...]) -> typing.Iterator[tuple[str, ...]]:
        for key, value in doc.items():
            if isinstance(value, dict):
                yield from leaves(value, (*prefix, key))
            else:
                yield (*prefix, key)

    missing = [p for p in leaves(config_to_document(Config()), ()) if p not in with_default]
    assert missing == []


def test_sharing_defaults() -> None:
    fail_field = next(f for f in fields(ReplicatedResources) if f.name == "fail_requests_greater_than_one")
    rename_field = next(f for f in fields(ReplicatedResources) if f.name == "rename_by_default")
    for kind in ("timeSlicing", "mps"):
        node = node_at(("sharing", kind))
        assert node is not None
        props = object_properties(node)
        assert props["renameByDefault"]["default"] is rename_field.default
    ts, mps = node_at(("sharing", "timeSlicing")), node_at(("sharing", "mps"))
    assert ts is not None and mps is not None
    assert object_properties(ts)["failRequestsGreaterThanOne"]["default"] is fail_field.default is False
    assert object_properties(mps)["failRequestsGreaterThanOne"]["default"] is True


def test_defaults_document_round_trips() -> None:
    doc = config_to_document(Config())
    assert load_config_text(json.dumps(doc), "defaults.json", env={}) == Config(source="defaults.json")


@pytest.mark.parametrize(
    "name",
    [
        "devices-forms.yaml",
        "flags-list-strategy.yaml",
        "gfd-sleep-nanoseconds.json",
        "time-slicing-rename-by-default.yaml",
        "seed-004-mps.yaml",
    ],
)
def test_shown_document_round_trips(name: str) -> None:
    path = Path(__file__).parent / "valid" / name
    config = load_config_text(path.read_bytes(), name, env={})
    again = load_config_text(json.dumps(config_to_document(config)), name, env={})
    assert again == config
