"""`nvdp dra slices`: the ResourceSlices the DRA driver would publish for a node, as a table of their
devices (`-o json|yaml`: the slices themselves)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, get_args

from nvdp.config.model import Mode
from nvdp.dra.pool.devices import NUMA_NODE
from nvdp.dra.pool.names import DEFAULT_DRIVER, check_driver_name
from nvdp.text import columns

if TYPE_CHECKING:
    from nvdp.dra.pool.contents import Owns

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NUMBERED = re.compile(r"^(.*-)(\d+)$")
GIB = 1 << 30


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `dra` with its `slices` command on an argparse subparsers object."""
    from nvdp.config.flags import add_config_option
    from nvdp.daemon.preview import add_node_option, add_output_option

    dra: argparse.ArgumentParser = subparsers.add_parser(
        "dra", help="DRA driver mode tools", description="DRA driver mode tools."
    )
    commands = dra.add_subparsers(dest="dra_command", metavar="COMMAND", required=True)
    slices = commands.add_parser(
        "slices",
        help="show the ResourceSlices a node would publish",
        description=(
            "Show the ResourceSlices (resource.k8s.io/v1) the DRA plugin would publish for a node under "
            "a config, computed as the plugin computes them: its GPUs, or the MIG devices of GPUs with "
            "MIG enabled, with the config's resource names and sharing. A table of their devices; "
            "-o json or -o yaml prints the slices. A node in device-plugin mode publishes none (a "
            "warning with the fix on stderr)."
        ),
    )
    add_node_option(slices)
    add_config_option(slices, "the plugin's config file (default: built-in defaults)")
    add_output_option(slices)
    slices.add_argument(
        "--default-mode",
        choices=get_args(Mode),
        default="dra",
        help="the mode of a node whose config sets no flags.mode: the chart's dra.defaultMode, env "
        "NVDP_DEFAULT_MODE of the plugin (default %(default)s, as the chart's)",
    )
    slices.add_argument(
        "--driver", default=DEFAULT_DRIVER, help=f"DRA driver name (default {DEFAULT_DRIVER})"
    )
    slices.add_argument("--node-name", metavar="NAME",
                        help="the node's name (default: the profile's name, or this node's)")
    slices.add_argument(
        "--health-record",
        metavar="FILE",
        help="the node's health.json (the chart's devicePlugin.healthRecovery.stateDir): devices of GPUs "
        "that are down get the taints the plugin publishes for them, and why on stderr",
    )
    slices.set_defaults(handler=run)
    return dra


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the slices; bad input gives one line naming the cause and the fix, and exit status 2.
    Why the plugin would publish nothing (device-plugin mode, a MIG GPU without MIG devices) is a
    warning on `err`, with the fix."""
    from nvdp.config.issues import ConfigError
    from nvdp.config.loader import load_config
    from nvdp.daemon.pernode.mode import node_mode
    from nvdp.daemon.preview import PreviewError, node_gpus, print_document
    from nvdp.dra.pool.contents import DEFAULT_MODE_ENV, pool_devices, pool_warnings, published_slices
    from nvdp.plan import PlanError

    out = out or sys.stdout
    err = err or sys.stderr
    problem = check_driver_name(args.driver)
    if problem is not None:
        return _fail(err, f"--driver: {problem}")
    try:
        # The preview ignores this shell's environment: the plugin's comes from the chart.
        config = load_config(args.config_file, {}, {}, path_flag="--config")
    except ConfigError as e:
        more = f" (and {len(e.issues) - 1} more)" if len(e.issues) > 1 else ""
        return _fail(err, f"--config: {e.issues[0]}{more}")
    try:
        gpus = node_gpus(config, args.node)
    except PreviewError as e:
        return _fail(err, str(e))
    node = args.node_name or gpus.name
    if len(node) > 253 or not _DNS_SUBDOMAIN.match(node):
        return _fail(err, f"--node-name: {node!r} is not a node name; give a lower-case DNS subdomain")
    owns = _claims_mig(args.driver) if args.node is None else None
    try:
        devices = pool_devices(config, gpus.inventory) if owns is None else \
            pool_devices(config, gpus.inventory, owns)
    except PlanError as e:
        return _fail(err, f"--config: the config cannot be applied to node {node}'s GPUs: {e}")
    mode = node_mode(config, {DEFAULT_MODE_ENV: args.default_mode})
    for warning in pool_warnings(config, gpus.inventory, mode,
                                 default_is=f"--default-mode {args.default_mode}",
                                 default_fix="--default-mode dra (the chart's dra.defaultMode)"):
        print(f"nvdp dra slices: warning: {warning}", file=err)
    taints = None
    if args.health_record:
        from nvdp.dra.pool.taints import device_health_for, slice_taints

        record = _read_record(args.health_record)
        if isinstance(record, str):
            return _fail(err, f"--health-record: {record}")
        health = device_health_for(config, devices, record)
        taints = slice_taints(health)
        for h in health.values():
            if h.taints:
                marks = ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in h.taints)
                state = "healthy" if h.healthy else "down"
                print(f"nvdp dra slices: {h.device} ({state}) tainted {marks}: {h.message}", file=err)
    slices = published_slices(mode, node=node, node_uid="", driver=args.driver, devices=devices,
                              taints=taints)
    if args.output != "table":
        print_document(slices, args.output, out)
        return 0
    print(f"Node: {gpus.describe()}", file=out)
    print(f"Config: {config.source} (migStrategy {config.flags.mig_strategy}, mode {mode})\n", file=out)
    for line in slices_table(slices):
        print(line, file=out)
    return 0


def _claims_mig(driver: str) -> Owns:
    """On this node: whether the DRA plugin made a MIG device for a claim (its checkpoint, read as
    the plugin reads it at start), so that the placements of those devices are shown as it publishes
    them."""
    from nvdp.dra.claims.checkpoint import CHECKPOINT_FILE, read_owned_mig
    from nvdp.dra.main import DEFAULT_PLUGINS_DIR, PLUGINS_DIR_ENV

    folder = os.environ.get(PLUGINS_DIR_ENV) or DEFAULT_PLUGINS_DIR
    return read_owned_mig(os.path.join(folder, driver, CHECKPOINT_FILE)).owns


def slices_table(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """The slices as lines: a summary, their counter sets, and one row per device (the columns that
    apply: type, MIG profile, product, memory, resource, NUMA node, replicas (with "strict" where the
    capacity's request policy allows one share size), counters consumed, taints)."""
    if not slices:
        return ["No ResourceSlices would be published."]
    spec = slices[0]["spec"]
    devices = [(s, d) for s in slices for d in s["spec"].get("devices", [])]
    lines = [f"{len(slices)} ResourceSlice{'s' if len(slices) != 1 else ''} of driver {spec['driver']}, "
             f"pool {spec['pool']['name']}: {len(devices)} device{'s' if len(devices) != 1 else ''}"]
    for s in slices:
        for counter_set in s["spec"].get("sharedCounters", []):
            lines.append(f"counter set {counter_set['name']}: {_counters(counter_set['counters'])}")
    if not devices:
        return lines
    rows = [_device_row(d) for _, d in devices]
    header = ("DEVICE", "TYPE", "PROFILE", "PRODUCT", "MEMORY", "RESOURCE", "NUMA", "REPLICAS", "COUNTERS",
              "TAINTS")
    shown = [i for i in range(len(header)) if i < 6 or any(row[i] for row in rows)]
    lines.append("")
    lines += columns([header[i] for i in shown], ([row[i] or "-" for i in shown] for row in rows))
    return lines


def _device_row(device: Mapping[str, Any]) -> tuple[str, ...]:
    attributes = device.get("attributes", {})
    capacity = device.get("capacity", {})

    def attribute(name: str) -> str:
        value = attributes.get(name, {})
        return str(next(iter(value.values()), "")) if value else ""

    memory = capacity.get("memory", {}).get("value")
    consumed = "; ".join(f"{c['counterSet']}: {_counters(c['counters'])}"
                         for c in device.get("consumesCounters", []))
    taints = ", ".join(f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}"
                       for t in device.get("taints", []))
    replicas = capacity.get("replicas", {})
    strict = " (strict)" if replicas.get("requestPolicy", {}).get("validValues") else ""
    numa = attributes.get(NUMA_NODE, {})
    return (device["name"], attribute("type"), attribute("profile"), attribute("productName"),
            f"{int(memory) / GIB:.1f} GiB" if memory else "", attribute("resource"),
            str(next(iter(numa.values()), "")) if numa else "",
            f"{replicas['value']}{strict}" if replicas.get("value") else "", consumed, taints)


def _counters(counters: Mapping[str, Mapping[str, str]]) -> str:
    """`memory-slice-0..7, compute-slices 7`: runs of numbered counters of 1 as one range, others with
    their value."""
    parts: list[str] = []
    run: tuple[str, int, int] | None = None
    for name, entry in counters.items():
        value = entry.get("value", "")
        numbered = _NUMBERED.match(name)
        if numbered and value == "1":
            prefix, number = numbered.group(1), int(numbered.group(2))
            if run and run[0] == prefix and run[2] == number - 1:
                run = (prefix, run[1], number)
                continue
            if run:
                parts.append(_run(run))
            run = (prefix, number, number)
            continue
        if run:
            parts.append(_run(run))
            run = None
        parts.append(f"{name} {value}")
    if run:
        parts.append(_run(run))
    return ", ".join(parts)


def _run(run: tuple[str, int, int]) -> str:
    prefix, first, last = run
    return f"{prefix}{first}" if first == last else f"{prefix}{first}..{last}"


def _read_record(path: str) -> dict[str, Any] | str:
    """The health record in `path` (a health.json), or why it cannot be used."""
    from nvdp.health.state import VERSION

    try:
        document = json.loads(Path(path).read_text())
    except OSError as e:
        return f"cannot read {path}: {e.strerror}; give the health.json of the node's healthStateDir"
    except ValueError as e:
        return f"{path} is not JSON ({e}); give the health.json of the node's healthStateDir"
    if not isinstance(document, dict) or document.get("version") != VERSION:
        return f"{path} is not a version {VERSION} health record (health.json, written by the plugin)"
    return document


def _fail(err: TextIO, message: str) -> int:
    print(f"nvdp dra slices: error: {message}", file=err)
    return 2
