"""Config -> config document (camelCase keys, every value explicit): what `nvdp config show` prints.

Key names come from the schema, so the output always loads back into the same Config.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from nvdp.config.issues import DocPath
from nvdp.config.model import Config, DeviceSelection
from nvdp.config.schema import accepted_types, node_at, object_properties, snake_case


def config_to_document(config: Config) -> dict[str, Any]:
    doc = _to_document(config, ())
    assert isinstance(doc, dict)
    return doc


def _to_document(value: object, path: DocPath) -> Any:
    if isinstance(value, DeviceSelection):
        if value.refs:
            return list(value.refs)
        return value.count if value.count is not None else "all"
    if isinstance(value, Struct):
        node = node_at(path)
        doc: dict[str, Any] = {}
        for key, sub in (object_properties(node) if node is not None else {}).items():
            attr = snake_case(key)
            if not hasattr(value, attr):
                continue
            field_value = getattr(value, attr)
            if field_value is None and "null" not in accepted_types(sub):
                continue  # an absent optional block (e.g. sharing.mps) or field (rename)
            doc[key] = _to_document(field_value, (*path, key))
        return doc
    if isinstance(value, tuple):
        return [_to_document(item, (*path, i)) for i, item in enumerate(value)]
    return value
