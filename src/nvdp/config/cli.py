"""`nvdp config validate FILE` and `nvdp config show [FILE]`."""

from __future__ import annotations

import argparse
import sys
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
    show.set_defaults(handler=show_command)


def validate_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, env={})
    except ConfigError as exc:
        return _report(exc, args.file)
    print(f"{args.file}: valid ({summary(config)})")
    return 0


def show_command(args: argparse.Namespace) -> int:
    path = args.file or args.config_file
    try:
        config = load_config(path, overrides=overrides_from_args(args))
    except ConfigError as exc:
        return _report(exc, path or "configuration")
    sys.stdout.write(yaml.safe_dump(config_to_document(config), sort_keys=False))
    return 0


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
