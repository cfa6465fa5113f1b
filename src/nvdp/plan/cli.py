"""`nvdp plan`: preview what a node would advertise under a config, before installing the chart."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from nvdp.config.model import Config
from nvdp.inventory.model import Inventory
from nvdp.plan.build import plan
from nvdp.plan.errors import PlanError
from nvdp.plan.model import Plan
from nvdp.plan.summary import plan_summary_rows, plan_to_dict, render_table

# Profiles shipped in a source checkout, so `--node t4` works without a path.
_CHECKOUT_PROFILES = Path(__file__).resolve().parents[3] / "sim" / "profiles"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show the resources a node would advertise under a config",
        description=(
            "Show the resources a node would advertise under a config: resource names, counts, "
            "the GPUs behind each, sharing, warnings and devices left out (with the reason)."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="plugin config file (default: built-in defaults)")
    parser.add_argument("--config-dir", metavar="DIR", help="a directory of config entries (the chart's "
                        "config.map as files); the entry is chosen as on a node: --label, else "
                        "--default-config, else --fallback-strategies")
    parser.add_argument("--label", metavar="ENTRY", default="",
                        help="value of the node label nvidia.com/device-plugin.config (with --config-dir)")
    parser.add_argument("--default-config", metavar="ENTRY", help="config.default (with --config-dir)")
    parser.add_argument("--fallback-strategies", metavar="LIST", default="named,single",
                        help="config.fallbackStrategies, comma-separated (with --config-dir; default "
                        "named,single)")
    parser.add_argument(
        "--node",
        metavar="PROFILE",
        required=True,
        help="node profile: a YAML/JSON file, or the name of one in sim/profiles (e.g. t4)",
    )
    parser.add_argument(
        "--mig-strategy",
        choices=("none", "single", "mixed", "dynamic"),
        help="override flags.migStrategy from the config",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(handler=run)


def resolve_profile(node: str) -> Path:
    """A path as given if it exists; else a profile name looked up in sim/profiles."""
    given = Path(node)
    if given.exists() or given.suffix or len(given.parts) > 1:
        return given
    for folder in (Path.cwd() / "sim" / "profiles", _CHECKOUT_PROFILES):
        for suffix in (".yaml", ".yml", ".json"):
            candidate = folder / f"{node}{suffix}"
            if candidate.is_file():
                return candidate
    return given


def _load(args: argparse.Namespace) -> tuple[Config, Inventory, Path]:
    # Imported here: both loaders pull in YAML/schema machinery the rest of `nvdp` does not need.
    from nvdp.config.loader import load_config
    from nvdp.inventory.profile import load_profile

    # The preview ignores this shell's environment: the plugin's env comes from the chart.
    overrides = {"flags.migStrategy": args.mig_strategy} if args.mig_strategy else {}
    cfg = load_config(chosen_file(args), {}, overrides)
    profile = resolve_profile(args.node)
    return cfg, load_profile(profile), profile


def chosen_file(args: argparse.Namespace) -> str | None:
    """--config, or the entry of --config-dir a node with --label would get (prints which, to stderr)."""
    config_dir = getattr(args, "config_dir", None)
    if not config_dir:
        return str(args.config) if args.config else None
    from nvdp.config.entries import entry_path, list_entries
    from nvdp.config.select import parse_fallbacks, select_entry

    if args.config:
        raise SelectionUsage("--config and --config-dir exclude each other")
    try:
        entries = list_entries(config_dir)
    except OSError as e:
        raise SelectionUsage(f"cannot read --config-dir {config_dir}: {e.strerror or e}") from None
    selection = select_entry(entries, args.label or None, args.default_config,
                             parse_fallbacks(args.fallback_strategies))
    args.entry_line = f"Entry: {selection.describe()}; entries in {config_dir}: {', '.join(entries)}"
    return str(entry_path(config_dir, selection.entry)) if selection.entry is not None else None


class SelectionUsage(Exception):
    """Contradictory or unusable --config / --config-dir arguments."""


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from nvdp.config.issues import ConfigError
    from nvdp.config.select import SelectionError
    from nvdp.inventory.profile import ProfileError

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        cfg, inventory, profile = _load(args)
        result = plan(cfg, inventory)
    except (ConfigError, ProfileError, PlanError, SelectionError, SelectionUsage) as e:
        print(f"nvdp plan: error: {e}", file=err)
        return 2
    if args.json:
        doc: dict[str, object] = {
            "config": cfg.source,
            "node": str(profile),
            "mig_strategy": cfg.flags.mig_strategy,
        }
        if getattr(args, "entry_line", None):
            doc["entry"] = args.entry_line
        doc.update(plan_to_dict(result, inventory))
        print(json.dumps(doc, indent=2), file=out)
    else:
        if getattr(args, "entry_line", None):
            print(args.entry_line, file=out)
        for line in render(result, inventory, cfg, profile):
            print(line, file=out)
    return 0


def render(result: Plan, inventory: Inventory, cfg: Config, profile: Path) -> list[str]:
    gpus = len(inventory.gpus)
    lines = [
        f"Node: {profile} ({gpus} GPU{'' if gpus == 1 else 's'}, driver {inventory.driver_version})",
        f"Config: {cfg.source} (migStrategy {cfg.flags.mig_strategy})",
        "",
    ]
    if result.resources:
        lines += render_table(plan_summary_rows(result, inventory))
    else:
        lines.append("No resources would be advertised.")
    if result.warnings:
        lines += ["", "Warnings:"] + [f"  - {w}" for w in result.warnings]
    if result.excluded:
        lines += ["", "Excluded devices:"] + [f"  - {e.device}: {e.reason}" for e in result.excluded]
    return lines
