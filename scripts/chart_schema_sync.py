"""Keep the chart's copies of the config schema in step with config-schema.json.

Two files in the chart are generated from the repository's config-schema.json:

- values.schema.json `$defs.nvdpConfig`: the schema itself, so Helm checks inline config entries
  written as YAML objects at install time. Helm's validator reads draft 2020-12, so the schema is
  copied as is, except that its `$id`/`$schema` are dropped, its `#/...` references are re-rooted
  under `#/$defs/nvdpConfig/...` (they would otherwise resolve against values.schema.json), and
  `additionalProperties: false` is left out: Helm's schema error for an unknown key cannot say where
  the key belongs, so validation.yaml checks the keys of inline entries as it does for strings.
- templates/_config_keys.tpl: the schema itself without annotations, which validation.yaml applies
  to string entries (Helm does not give templates values.schema.json); the known keys of every
  object in the config file, which
  validation.yaml uses to reject unknown keys in string entries (from --set-file), where the schema
  cannot reach; and, per object, the loader's own "did you mean" for every key name the schema
  knows, so a misplaced or wrongly cased key gets the same suggestion at install time as from
  `nvdp config validate` (a misspelt one gets the list of keys valid there).

Run `python scripts/chart_schema_sync.py` from the repository root to rewrite both;
`--check` only reports whether they are stale (exit status 1).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG_SCHEMA = ROOT / "config-schema.json"
CHART_DIR = ROOT / "charts" / "nvidia-device-plugin"
VALUES_SCHEMA = CHART_DIR / "values.schema.json"
KEYS_TEMPLATE = CHART_DIR / "templates" / "_config_keys.tpl"
EMBEDDED_NAME = "nvdpConfig"
EMBEDDED_REF_PREFIX = f"#/$defs/{EMBEDDED_NAME}"

Json = dict[str, Any]


def _rerooted(node: Any) -> Any:
    if isinstance(node, dict):
        out: Json = {}
        for key, value in node.items():
            if key == "additionalProperties" and value is False:
                continue  # unknown keys: validation.yaml, with the loader's did-you-mean
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = EMBEDDED_REF_PREFIX + value[1:]
            else:
                out[key] = _rerooted(value)
        return out
    if isinstance(node, list):
        return [_rerooted(item) for item in node]
    return node


def embedded_config_schema(config_schema: Json) -> Json:
    """The config schema as it sits under values.schema.json's `$defs`."""
    body = {k: v for k, v in copy.deepcopy(config_schema).items() if k not in ("$id", "$schema")}
    rerooted: Json = _rerooted(body)
    return rerooted


def _resolve(schema: Json, node: Json) -> list[Json]:
    """The node and every subschema whose properties also apply to it ($ref, allOf/oneOf/anyOf)."""
    found = [node]
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = schema
        for part in ref[2:].split("/"):
            target = target[part]
        found.extend(_resolve(schema, target))
    for combinator in ("allOf", "oneOf", "anyOf"):
        for branch in node.get(combinator, []):
            found.extend(_resolve(schema, branch))
    return found


def config_key_paths(config_schema: Json) -> dict[str, list[str]]:
    """Known keys per object path ("" is the top level, "[]" marks list items).

    Only objects that forbid unknown keys are listed; the chart checks nothing else.
    """
    paths: dict[str, list[str]] = {}

    def walk(path: str, node: Json) -> None:
        parts = _resolve(config_schema, node)
        keys: list[str] = []
        closed = False
        children: dict[str, list[Json]] = {}
        items: list[Json] = []
        for part in parts:
            if part.get("additionalProperties") is False:
                closed = True
            for key, sub in part.get("properties", {}).items():
                if key not in keys:
                    keys.append(key)
                children.setdefault(key, []).append(sub)
            if isinstance(part.get("items"), dict):
                items.append(part["items"])
        if closed and keys:
            paths[path] = sorted(keys)
        for key, subs in children.items():
            for sub in subs:
                walk(f"{path}.{key}" if path else key, sub)
        for item in items:
            walk(f"{path}[]", item)

    walk("", config_schema)
    return dict(sorted(paths.items()))


# Stands for a list index in the parent path while the loader's suggestion is computed; the
# template puts the user's real indices back through PARENT_MARK.
_INDEX_SENTINEL = 987654321
PARENT_MARK = "{parent}"


def key_hints(config_schema: Json) -> dict[str, dict[str, str]]:
    """Per object path, lowercased key name -> where the loader says such a key belongs.

    The suggestion comes from nvdp.config.validate.suggest_key itself (it reads the same
    config-schema.json), so the chart and `nvdp config validate` cannot disagree. Where it runs
    through the object's own path, that part is PARENT_MARK, for the template to show real indices.
    """
    from nvdp.config.issues import format_path
    from nvdp.config.schema import key_paths
    from nvdp.config.validate import suggest_key

    names = sorted({path[-1].lower() for path in key_paths() if path[-1] != "[]"})
    hints: dict[str, dict[str, str]] = {}
    for object_path, keys in config_key_paths(config_schema).items():
        parent: list[str | int] = []
        for part in object_path.replace("[]", ".[]").split(".") if object_path else []:
            parent.append(_INDEX_SENTINEL if part == "[]" else part)
        shown_parent = format_path(parent)
        here: dict[str, str] = {}
        for name in names:
            # A name that is a key here only in another case: ask as the user would have typed it.
            asked = name.upper() if any(k.lower() == name for k in keys) else name
            if asked in keys:
                continue
            text = suggest_key(tuple(parent), asked)
            if not text.startswith("did you mean "):
                continue
            target = text.removeprefix("did you mean ").removesuffix("?")
            if shown_parent and target.startswith(shown_parent) and str(_INDEX_SENTINEL) in shown_parent:
                target = PARENT_MARK + target[len(shown_parent) :]
            here[name] = target
        hints[object_path] = here
    return hints


def keys_template(config_schema: Json) -> str:
    paths = json.dumps(config_key_paths(config_schema), sort_keys=True)
    hints = json.dumps(key_hints(config_schema), sort_keys=True)
    return (
        "{{/*\n"
        "Generated from config-schema.json by `python scripts/chart_schema_sync.py`; do not edit.\n"
        "Known keys of each object in the plugin's config file, for validation.yaml.\n"
        "*/}}\n"
        '{{- define "nvidia-device-plugin.configKeys" -}}\n'
        f"{paths}\n"
        "{{- end -}}\n"
        "{{/*\n"
        "Per object: lowercased key name -> where such a key belongs (the loader's did-you-mean);\n"
        f"{PARENT_MARK} stands for the object's own path with the user's list indices.\n"
        "*/}}\n"
        '{{- define "nvidia-device-plugin.configKeyHints" -}}\n'
        f"{hints}\n"
        "{{- end -}}\n"
        "{{/*\n"
        "The config schema as values.schema.json embeds it ($defs.nvdpConfig), without its annotations,\n"
        "for the string entries (_config_schema_check.tpl): Helm keeps values.schema.json out of .Files.\n"
        "*/}}\n"
        '{{- define "nvidia-device-plugin.configSchema" -}}\n'
        f"{json.dumps(_without_annotations(embedded_config_schema(config_schema)), sort_keys=True)}\n"
        "{{- end -}}\n"
    )


ANNOTATIONS = {"title", "description", "default", "$comment", "$schema", "$id", "examples"}


def _without_annotations(node: Any) -> Any:
    """The schema's validation keywords only (property names are kept whatever they are called)."""
    if isinstance(node, list):
        return [_without_annotations(item) for item in node]
    if not isinstance(node, dict):
        return node
    kept: Json = {}
    for key, value in node.items():
        if key in ("properties", "$defs"):
            kept[key] = {name: _without_annotations(sub) for name, sub in value.items()}
        elif key not in ANNOTATIONS:
            kept[key] = _without_annotations(value)
    return kept


def synced_values_schema(values_schema: Json, config_schema: Json) -> Json:
    updated = copy.deepcopy(values_schema)
    updated.setdefault("$defs", {})[EMBEDDED_NAME] = embedded_config_schema(config_schema)
    return updated


def _dump(data: Json) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def stale_files(write: bool) -> list[Path]:
    """The generated files that differ from what config-schema.json gives; rewritten if `write`."""
    config_schema = json.loads(CONFIG_SCHEMA.read_text(encoding="utf-8"))
    values_schema = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    wanted = {
        VALUES_SCHEMA: _dump(synced_values_schema(values_schema, config_schema)),
        KEYS_TEMPLATE: keys_template(config_schema),
    }
    stale = []
    for path, text in wanted.items():
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            stale.append(path)
            if write:
                path.write_text(text, encoding="utf-8")
    return stale


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    stale = stale_files(write=not check_only)
    for path in stale:
        verb = "stale" if check_only else "rewrote"
        print(f"{verb}: {path.relative_to(ROOT)}")
    return 1 if (check_only and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
