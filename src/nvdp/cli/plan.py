"""`nvdp plan`: preview what a node would advertise under a config, before installing the chart.

It computes with the daemons' own functions: the config loader, the node's GPUs (a profile, or this
node's through the plugin's NVML discovery), `plan`, and in DRA mode the DRA plugin's pool.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from nvdp.config.model import Config
from nvdp.plan.model import Plan
from nvdp.plan.summary import plan_summary_rows, plan_to_dict, render_table

if TYPE_CHECKING:
    from nvdp.daemon.preview import NodeGpus


def register(subparsers: Any) -> None:
    from nvdp.config.flags import add_config_option
    from nvdp.daemon.preview import add_node_option, add_output_option

    parser = subparsers.add_parser(
        "plan",
        help="show the resources a node would advertise under a config",
        description=(
            "Show the resources a node would advertise under a config: resource names, counts, "
            "the GPUs behind each, sharing, warnings and devices left out (with the reason). A config "
            "in DRA mode advertises none: the devices the DRA plugin publishes are shown instead."
        ),
    )
    add_node_option(parser)
    add_config_option(parser, "the plugin's config file (default: built-in defaults)")
    add_output_option(parser)
    parser.add_argument("--json", dest="output", action="store_const", const="json", help="-o json")
    parser.add_argument(
        "--mig-strategy",
        choices=("none", "single", "mixed", "dynamic"),
        help="override flags.migStrategy of the config",
    )
    entries = parser.add_argument_group(
        "per-node config", "The entry of --config-dir a node gets: its label's, else config.default's, "
        "else one by the fallback strategies.")
    entries.add_argument("--config-dir", metavar="DIR",
                         help="a folder of config entries (the chart's config.map as files)")
    entries.add_argument("--label", metavar="ENTRY", default="",
                         help="the node's label nvidia.com/device-plugin.config")
    entries.add_argument("--default-config", metavar="ENTRY", help="the chart's config.default")
    entries.add_argument("--fallback-strategies", metavar="LIST", default="named,single",
                         help="the chart's config.fallbackStrategies (default %(default)s)")
    parser.set_defaults(handler=run)


def chosen_file(args: argparse.Namespace) -> str | None:
    """--config, or the entry of --config-dir a node with --label would get (prints which, to stderr)."""
    config_dir = getattr(args, "config_dir", None)
    if not config_dir:
        return str(args.config_file) if args.config_file else None
    from nvdp.config.entries import entry_path, list_entries
    from nvdp.config.select import parse_fallbacks, select_entry

    if args.config_file:
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
    from nvdp.config.loader import load_config
    from nvdp.config.select import SelectionError
    from nvdp.daemon.preview import PreviewError, node_gpus, print_document
    from nvdp.dra.pool.contents import pool_devices, published_slices
    from nvdp.dra.pool.names import DEFAULT_DRIVER
    from nvdp.plan import PlanError, plan

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        # The preview ignores this shell's environment: the plugin's env comes from the chart.
        overrides = {"flags.migStrategy": args.mig_strategy} if args.mig_strategy else {}
        cfg = load_config(chosen_file(args), {}, overrides, path_flag="--config")
        gpus = node_gpus(cfg, args.node)
        result = plan(cfg, gpus.inventory)
        # In DRA mode the device plugin advertises nothing; the DRA plugin publishes the pool.
        slices = None if cfg.flags.mode != "dra" else published_slices(
            "dra", node=gpus.name, node_uid="", driver=DEFAULT_DRIVER,
            devices=pool_devices(cfg, gpus.inventory))
    except (ConfigError, PlanError, PreviewError, SelectionError, SelectionUsage) as e:
        print(f"nvdp plan: error: {e}", file=err)
        return 2
    entry = getattr(args, "entry_line", None)
    if args.output != "table":
        doc: dict[str, object] = {
            "config": cfg.source,
            "node": str(gpus.profile) if gpus.profile is not None else gpus.name,
            "mig_strategy": cfg.flags.mig_strategy,
            "mode": cfg.flags.mode or "device-plugin",
        }
        if entry:
            doc["entry"] = entry
        doc.update(plan_to_dict(result, gpus.inventory))
        if slices is not None:
            doc["resources"] = []
            doc["slices"] = slices
        print_document(doc, args.output, out)
        return 0
    if entry:
        print(entry, file=out)
    for line in render(result, gpus, cfg, slices):
        print(line, file=out)
    return 0


def render(result: Plan, gpus: NodeGpus, cfg: Config, slices: list[dict[str, Any]] | None) -> list[str]:
    from nvdp.dra.cli import slices_table

    mode = ", mode dra" if slices is not None else ""
    lines = [f"Node: {gpus.describe()}", f"Config: {cfg.source} (migStrategy {cfg.flags.mig_strategy}{mode})",
             ""]
    if slices is not None:
        lines += ["DRA mode: the device plugin advertises nothing; the DRA plugin publishes these devices",
                  "(`nvdp dra slices` shows its ResourceSlices).", ""]
        lines += slices_table(slices)
    elif result.resources:
        lines += render_table(plan_summary_rows(result, gpus.inventory))
    else:
        lines.append("No resources would be advertised.")
    if result.warnings:
        lines += ["", "Warnings:"] + [f"  - {w}" for w in result.warnings]
    if result.excluded:
        lines += ["", "Excluded devices:"] + [f"  - {e.device}: {e.reason}" for e in result.excluded]
    return lines
