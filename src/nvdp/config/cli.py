"""`nvdp config validate --config FILE` and `nvdp config show [--config FILE]` (FILE alone: the same)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from nvdp.config.document import config_to_document
from nvdp.config.flags import CONFIG_FLAG, add_config_arguments, add_config_option, overrides_from_args
from nvdp.config.issues import ConfigError
from nvdp.config.loader import load_config
from nvdp.config.model import Config, ReplicatedResources
from nvdp.config.sources import CONFIG_FILE_ENV

EXIT_INVALID = 2


def register(sub: Any) -> None:
    """Add the `config` command to `nvdp`'s subparsers."""
    parser = sub.add_parser("config", help="check or show the plugin configuration")
    commands = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION")

    validate = commands.add_parser(
        "validate",
        help="check a config file",
        description="Check a config file on its own (environment variables are not applied). "
        "Exit 0 if valid, 2 with every problem listed if not.",
    )
    add_config_option(validate, "the config file (YAML or JSON; default: env CONFIG_FILE); FILE alone does "
                      "the same")
    validate.add_argument("file", nargs="?", metavar="FILE", help=argparse.SUPPRESS)
    validate.set_defaults(handler=validate_command)

    show = commands.add_parser(
        "show",
        help="print the effective configuration",
        description="Print the configuration the plugin would run with, after environment variables "
        "and flags, as YAML with every value explicit. Exit 2 with every problem listed if invalid.",
    )
    show.add_argument("file", nargs="?", metavar="FILE", help=argparse.SUPPRESS)
    node = show.add_argument_group(
        "per-node config", "Which entry a node gets: --node with --configmap or --config-dir.")
    node.add_argument("--node", metavar="NAME", help="read this node's labels (KUBECONFIG or --kubeconfig) "
                      "and show the entry it gets and that config")
    node.add_argument("--configmap", metavar="NAMESPACE/NAME", help="the ConfigMap holding the entries "
                      "(the chart's <release>-configs, or config.name)")
    node.add_argument("--config-dir", metavar="DIR", help="the entries as files instead of --configmap")
    node.add_argument("--default-config", metavar="ENTRY", help="the chart's config.default")
    node.add_argument("--fallback-strategies", metavar="LIST", default="named,single",
                      help="the chart's config.fallbackStrategies (default %(default)s)")
    node.add_argument("--node-label", metavar="KEY", default="nvidia.com/device-plugin.config",
                      help="the label naming the entry (default %(default)s)")
    node.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: KUBECONFIG, ~/.kube/config)")
    add_config_arguments(show, file_flag=CONFIG_FLAG, listed=False)
    show.set_defaults(handler=show_command)


def given_file(args: argparse.Namespace, command: str) -> str | None:
    """The config file of `nvdp config ACTION`: --config (or --config-file), or FILE, the older
    spelling; raises Usage when both name different files."""
    if args.file and args.config_file and args.file != args.config_file:
        raise Usage(f"nvdp config {command}: FILE {args.file} and --config {args.config_file} name two "
                    "files; give one, as --config FILE")
    return args.config_file or args.file or None


class Usage(Exception):
    """Arguments that contradict each other; the message says which and what to give."""


def validate_command(args: argparse.Namespace) -> int:
    try:
        path = given_file(args, "validate")
    except Usage as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    # In the plugin's pod the chart names the file in CONFIG_FILE.
    path = path or os.environ.get(CONFIG_FILE_ENV) or None
    if path is None:
        print(f"nvdp config validate: name the file to check: --config FILE (or set {CONFIG_FILE_ENV})",
              file=sys.stderr)
        return EXIT_INVALID
    try:
        config = load_config(path, env={}, path_flag="--config")
    except ConfigError as exc:
        return _report(exc, path)
    print(f"{path}: valid ({summary(config)})")
    return 0


def show_command(args: argparse.Namespace) -> int:
    try:
        path = given_file(args, "show")
    except Usage as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    if args.node or args.configmap or args.config_dir:
        return show_node_command(args, path)
    try:
        config = load_config(path, overrides=overrides_from_args(args), path_flag="--config")
    except ConfigError as exc:
        return _report(exc, path or "configuration")
    sys.stdout.write(yaml.safe_dump(config_to_document(config), sort_keys=False))
    return 0


def show_node_command(args: argparse.Namespace, path: str | None) -> int:
    """`nvdp config show --node N (--configmap NS/NAME | --config-dir DIR)`: N's entry and its config."""
    from nvdp.config.entries import list_entries
    from nvdp.config.loader import load_config_text
    from nvdp.config.select import SelectionError, parse_fallbacks, select_entry

    if not args.node or bool(args.configmap) == bool(args.config_dir) or path:
        print("nvdp config show: --node needs exactly one of --configmap NAMESPACE/NAME or --config-dir DIR "
              "(and no --config: the entry is the config)", file=sys.stderr)
        return EXIT_INVALID
    try:
        labels, entries = _node_and_entries(args)
        entry_names = list_entries(args.config_dir) if args.config_dir else tuple(sorted(entries))
        label = labels.get(args.node_label)
        selection = select_entry(entry_names, label, args.default_config,
                                 parse_fallbacks(args.fallback_strategies), args.node_label)
    except (SelectionError, _Unavailable, OSError) as exc:
        print(f"nvdp config show: {exc}", file=sys.stderr)
        return EXIT_INVALID
    labelled = f"{args.node_label}={label}" if label else f"no {args.node_label} label"
    source = args.configmap or args.config_dir
    print(f"# node {args.node} ({labelled}) gets {selection.describe()} of {source}")
    text: str | None = None
    if selection.entry is not None:
        text = entries[selection.entry] if args.configmap else \
            (Path(args.config_dir) / selection.entry).read_text()
    try:
        config = load_config_text(text, f"{source}:{selection.entry}", {}, overrides_from_args(args))
    except ConfigError as exc:
        print(f"# entry {selection.entry!r} is invalid: a node labelled onto it keeps its previous config",
              file=sys.stderr)
        return _report(exc, f"{source}:{selection.entry}")
    sys.stdout.write(yaml.safe_dump(config_to_document(config), sort_keys=False))
    return 0


class _Unavailable(Exception):
    """The cluster could not be asked (connection, permission, missing object)."""


def _node_and_entries(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    from nvdp.kube import KubeConnectError, connect, get_configmap_data, get_node_labels

    try:
        client = connect(args.kubeconfig)
        labels = dict(get_node_labels(client, args.node).labels)
        entries: dict[str, str] = {}
        if args.configmap:
            namespace, _, name = args.configmap.partition("/")
            if not name:
                raise _Unavailable(f"--configmap {args.configmap!r}: write it as NAMESPACE/NAME")
            entries = get_configmap_data(client, namespace, name)
    except KubeConnectError as exc:
        raise _Unavailable(str(exc)) from None
    except Exception as exc:  # lightkube ApiError or a transport error: say which, no traceback
        from nvdp.kube.watch import describe_error

        raise _Unavailable(describe_error(exc)) from None
    return labels, entries


def _report(exc: ConfigError, name: str) -> int:
    for issue in exc.issues:
        print(issue, file=sys.stderr)
    count = len(exc.issues)
    print(f"{name}: invalid ({count} problem{'s' if count != 1 else ''})", file=sys.stderr)
    return EXIT_INVALID


def summary(config: Config) -> str:
    """`v1; sharing: mps, 1 resource: nvidia.com/gpu x10`."""
    parts = [config.version]
    if config.flags.mig_strategy != "none":
        parts.append(f"migStrategy: {config.flags.mig_strategy}")
    if config.flags.mode is not None:
        parts.append(f"mode: {config.flags.mode}")
    blocks: list[tuple[str, ReplicatedResources]] = []
    if config.sharing.mps is not None:
        blocks.append(("mps", config.sharing.mps))
    if config.sharing.time_slicing is not None:
        blocks.append(("time-slicing", config.sharing.time_slicing))
    if not blocks:
        parts.append("sharing: none")
    for kind, block in blocks:
        count = len(block.resources)
        listed = ", ".join(
            f"{r.name} x{r.replicas}" + (f" as {r.rename}" if r.rename else "") for r in block.resources
        )
        parts.append(f"sharing: {kind}, {count} resource{'s' if count != 1 else ''}: {listed}")
    return "; ".join(parts)
