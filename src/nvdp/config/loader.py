"""Load the effective configuration: command-line flag > environment variable > config file > default.

Environment and flag values are written onto the parsed file document first, so one pass of schema
validation and semantic checks covers every source, and every problem names the source it came from.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

from nvdp.config.build import build_config
from nvdp.config.document import config_to_document
from nvdp.config.issues import ConfigError, ConfigIssue, DocPath
from nvdp.config.model import Config
from nvdp.config.schema import SchemaNode, accepted_types, child, node_at
from nvdp.config.semantic import semantic_issues
from nvdp.config.sources import CONFIG_FILE_ENV, ENV_VARS, convert_text, flag_for_path, split_path
from nvdp.config.validate import Locate, schema_issues

__all__ = ["ENV_VARS", "ConfigError", "ConfigIssue", "config_to_document", "load_config", "load_config_text"]


def load_config(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    env_vars: Mapping[str, str] = ENV_VARS,
) -> Config:
    """The effective Config from a file (or env CONFIG_FILE, or none), the environment and flags.

    `env=None` reads os.environ; `overrides` are command-line values keyed by dotted config path;
    `env_vars` maps the environment names the calling program reads to config paths.
    Raises ConfigError listing every problem found.
    """
    env = os.environ if env is None else env
    source = CONFIG_FILE_ENV if path is None and env.get(CONFIG_FILE_ENV) else "--config-file"
    if path is None:
        path = env.get(CONFIG_FILE_ENV) or None
    data: bytes | None = None
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(
                [
                    ConfigIssue(
                        path,
                        "",
                        f"cannot read the config file: {reason}",
                        fix=f"check the path given by {source}",
                    )
                ]
            ) from None
    return load_config_text(data, path or "defaults", env, overrides, env_vars)


def load_config_text(
    data: str | bytes | None,
    source: str = "<config>",
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    env_vars: Mapping[str, str] = ENV_VARS,
) -> Config:
    """Like load_config, from the file's content (`None`: no file). `source` names it in messages."""
    env = os.environ if env is None else env
    lines: dict[DocPath, int] = {}
    doc: dict[Any, Any] = {}
    if data is not None:
        # Imported here: without a config file the plugin process never needs a YAML parser.
        from nvdp.config.yamldoc import parse_document

        parsed = parse_document(data, source)
        lines = parsed.lines
        doc = copy.deepcopy(parsed.doc)  # YAML aliases share objects; keep edits local
    drop_unset(doc, node_at(()))
    origins: dict[DocPath, str] = {}
    issues: list[ConfigIssue] = []

    applied: set[str] = set()
    for name, path in env_vars.items():
        text = env.get(name)
        # An empty variable counts as unset, as charts often render optional values as "".
        if not path or path in applied or not text:
            continue
        applied.add(path)
        _apply(doc, origins, issues, path, text, name)
    for path, value in (overrides or {}).items():
        _apply(doc, origins, issues, path, value, flag_for_path(path) or f"override {path}")

    def locate(doc_path: DocPath) -> tuple[str, int | None]:
        for end in range(len(doc_path), 0, -1):
            origin = origins.get(doc_path[:end])
            if origin is not None:
                return origin, None
        return source, _line(lines, doc_path)

    issues += _checked(doc, locate)
    if issues:
        raise ConfigError(sorted(issues, key=_issue_order))
    return build_config(doc, source if data is not None else "defaults")


def _checked(doc: dict[Any, Any], locate: Locate) -> list[ConfigIssue]:
    try:
        return schema_issues(doc, locate) + semantic_issues(doc, locate)
    except RecursionError:
        # Only a self-referencing YAML alias nests this deep.
        source = locate(())[0]
        return [ConfigIssue(source, "", "the document refers to itself", fix="remove the looping alias")]


def drop_unset(value: object, node: SchemaNode | None) -> None:
    """Remove keys set to null (`flags:` with everything under it commented out): they mean "not set",
    as in NVIDIA's plugin, unless the schema gives null a meaning of its own."""
    if isinstance(value, dict):
        for key in list(value):
            sub = child(node, key) if node is not None and isinstance(key, str) else None
            if value[key] is None and sub is not None and "null" not in accepted_types(sub):
                del value[key]
            else:
                drop_unset(value[key], sub)
    elif isinstance(value, list) and node is not None:
        for item in value:
            drop_unset(item, child(node, 0))


def _apply(
    doc: dict[Any, Any],
    origins: dict[DocPath, str],
    issues: list[ConfigIssue],
    path: str,
    value: object,
    source: str,
) -> None:
    keys = split_path(path)
    node = node_at(keys) if keys else None
    if node is None:
        issues.append(ConfigIssue(source, path, "not a config setting", fix="check the setting's name"))
        return
    if isinstance(value, str) and accepted_types(node) != {"string"}:
        value, issue = convert_text(path, value, source)
        if issue is not None:
            issues.append(issue)
            return
    target: Any = doc
    for key in keys[:-1]:
        if not isinstance(target, dict):
            return  # the file has a non-mapping here; the schema reports it
        if target.get(key) is None:
            target[key] = {}
        target = target[key]
    if isinstance(target, dict):
        target[keys[-1]] = value
        origins[keys] = source


def _line(lines: Mapping[DocPath, int], path: DocPath) -> int | None:
    for end in range(len(path), 0, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None


def _issue_order(issue: ConfigIssue) -> tuple[bool, int, str]:
    return (issue.line is None, issue.line or 0, issue.path)
