"""CDI's own JSON schema (v1.1.0, tests/cdi/data/cdi-schema), as a validator for nvdp's specs."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_DIR = Path(__file__).parent / "data" / "cdi-schema"


@cache
def validator() -> Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    # schema.json refers to "defs.json#/definitions/...": serve it under that name.
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    return Draft7Validator(schema, registry=registry)


def schema_errors(document: Any) -> list[str]:
    """What CDI's schema finds wrong in `document` (a decoded spec), empty when it is valid."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(document)]
