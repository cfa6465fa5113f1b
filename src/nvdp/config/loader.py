"""Load the effective configuration: command-line flag > environment variable > config file > default.

Environment and flag values are written onto the parsed file document first, so one pass of schema
validation and semantic checks covers every source, and every problem names the source it came from.
"""

from __future__ import annotations

import copy
import os
import stat
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


def entry_in_force(config_file: str | None, env: Mapping[str, str], entry: os.PathLike[str] | None, *,
                   per_node: bool) -> tuple[str | None, Mapping[str, str]]:
    """The file and environment a daemon loads its config from. With per-node config the chosen entry
    (None: no file) replaces --config-file and CONFIG_FILE, which name the ConfigMap's default file
    that the entry was chosen instead of; without it, both stay as given."""
    if not per_node:
        return config_file, env
    return (str(entry) if entry is not None else None), {k: v for k, v in env.items() if k != CONFIG_FILE_ENV}


def load_config(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    env_vars: Mapping[str, str] = ENV_VARS,
    *,
    path_flag: str = "--config-file",
) -> Config:
    """The effective Config from a file (or env CONFIG_FILE, or none), the environment and flags.

    `env=None` reads os.environ; `overrides` are command-line values keyed by dotted config path;
    `env_vars` maps the environment names the calling program reads to config paths; `path_flag` is
    how the calling program takes `path` (the daemons: --config-file, nvdp's commands: --config), for
    the message about a file that cannot be read. Raises ConfigError listing every problem found.
    """
    env = os.environ if env is None else env
    source = CONFIG_FILE_ENV if path is None and env.get(CONFIG_FILE_ENV) else path_flag
    path = config_file_path(path, env)
    data: bytes | None = None
    if path is not None:
        try:
            data = read_config_file(path)
        except ConfigFileUnreadable as exc:
            fix = f"check the path given by {source}"
            issue = ConfigIssue(path, "", f"cannot read the config file: {exc}", fix=fix)
            raise ConfigError([issue]) from None
    return load_config_text(data, path or "defaults", env, overrides, env_vars)


def config_file_path(path: str | None, env: Mapping[str, str]) -> str | None:
    """The config file read: `path` (--config-file), else env CONFIG_FILE; None: the built-in defaults."""
    return path if path is not None else env.get(CONFIG_FILE_ENV) or None


# A ConfigMap holds at most 1 MiB; a config file is a few KiB.
MAX_CONFIG_BYTES = 1 << 20


class ConfigFileUnreadable(Exception):
    """The config file cannot be read; the message says why."""


def read_config_file(path: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The file's bytes; refuses what is not a regular file (a FIFO would block, /dev/zero never ends)
    and anything over `limit`, before reading it whole."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not hang start-up.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigFileUnreadable(exc.strerror or str(exc)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ConfigFileUnreadable(f"it is not a regular file ({_file_kind(mode)})")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise ConfigFileUnreadable(exc.strerror or str(exc)) from None
    if len(data) > limit:
        raise ConfigFileUnreadable(f"it is larger than {limit >> 10} KiB, which no config needs")
    return data


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a plain file"


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
