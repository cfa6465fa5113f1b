"""`nvdp config validate FILE` and `nvdp config show [FILE]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from nvdp.config.document import config_to_document
from nvdp.config.flags import add_config_arguments, overrides_from_args
from nvdp.config.issues import ConfigError
from nvdp.config.loader import load_config
from nvdp.config.model import Config, ReplicatedResources

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
    validate.add_argument("file", help="config file (YAML or JSON)")
    validate.set_defaults(handler=validate_command)

    show = commands.add_parser(
        "show",
        help="print the effective configuration",
        description="Print the configuration the plugin would run with, after environment variables "
        "and flags, as YAML with every value explicit. Exit 2 with every problem listed if invalid.",
    )
    show.add_argument("file", nargs="?", help="config file (default: --config-file, env CONFIG_FILE, none)")
    add_config_arguments(show)
    node = show.add_argument_group(
        "per-node config: which entry a node gets (--node with --configmap or --config-dir)")
    node.add_argument("--node", metavar="NAME", help="read this Kubernetes node's labels (uses KUBECONFIG "
                      "or --kubeconfig) and show the entry it gets and that config")
    node.add_argument("--configmap", metavar="NAMESPACE/NAME", help="the ConfigMap holding the entries "
                      "(the chart's <release>-configs, or config.name)")
    node.add_argument("--config-dir", metavar="DIR", help="the entries as files instead of --configmap")
    node.add_argument("--default-config", metavar="ENTRY", help="the chart's config.default")
    node.add_argument("--fallback-strategies", metavar="LIST", default="named,single",
                      help="the chart's config.fallbackStrategies, comma-separated (default named,single)")
    node.add_argument("--node-label", metavar="KEY", default="nvidia.com/device-plugin.config")
    node.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: KUBECONFIG, ~/.kube/config)")
    show.set_defaults(handler=show_command)


def validate_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, env={})
    except ConfigError as exc:
        return _report(exc, args.file)
    print(f"{args.file}: valid ({summary(config)})")
    return 0


def show_command(args: argparse.Namespace) -> int:
    if args.node or args.configmap or args.config_dir:
        return show_node_command(args)
    path = args.file or args.config_file
    try:
        config = load_config(path, overrides=overrides_from_args(args))
    except ConfigError as exc:
        return _report(exc, path or "configuration")
    sys.stdout.write(yaml.safe_dump(config_to_document(config), sort_keys=False))
    return 0


def show_node_command(args: argparse.Namespace) -> int:
    """`nvdp config show --node N (--configmap NS/NAME | --config-dir DIR)`: N's entry and its config."""
    from nvdp.config.entries import list_entries
    from nvdp.config.loader import load_config_text
    from nvdp.config.select import SelectionError, parse_fallbacks, select_entry

    if not args.node or bool(args.configmap) == bool(args.config_dir) or args.file:
        print("nvdp config show: --node needs exactly one of --configmap NAMESPACE/NAME or --config-dir DIR "
              "(and no FILE)", file=sys.stderr)
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
