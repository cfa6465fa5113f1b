"""`nvdp dra slices`: the ResourceSlices the DRA driver would publish for a node profile, as JSON."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, TextIO, get_args

from nvdp.config.model import Mode
from nvdp.dra.pool.names import DEFAULT_DRIVER, check_driver_name

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `dra` with its `slices` command on an argparse subparsers object."""
    dra: argparse.ArgumentParser = subparsers.add_parser(
        "dra", help="DRA driver mode tools", description="DRA driver mode tools."
    )
    commands = dra.add_subparsers(dest="dra_command", metavar="COMMAND", required=True)
    slices = commands.add_parser(
        "slices",
        help="print the ResourceSlices a node would publish",
        description=(
            "Print, as a JSON list, the ResourceSlices (resource.k8s.io/v1) the DRA plugin would publish "
            "for a node under a config, computed as the plugin computes them: its GPUs, or the MIG "
            "devices of GPUs with MIG enabled, with the config's resource names and sharing. A node in "
            "device-plugin mode publishes none (an empty list, and a warning with the fix on stderr)."
        ),
    )
    slices.add_argument(
        "--node",
        metavar="PROFILE",
        required=True,
        help="node profile: a YAML/JSON file, or the name of one in sim/profiles (e.g. t4)",
    )
    slices.add_argument("--config", metavar="FILE", help="plugin config file (default: built-in defaults)")
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
    slices.add_argument("--node-name", metavar="NAME", help="the node's name (default: the profile's name)")
    slices.add_argument(
        "--health-record",
        metavar="FILE",
        help="the node's health record (health.json in the chart's devicePlugin.healthRecovery.stateDir): "
        "devices of GPUs that are down are shown with the device taints the plugin publishes for them, "
        "and each tainted device's state and what brings it back is printed on stderr",
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
    from nvdp.dra.pool.contents import DEFAULT_MODE_ENV, pool_devices, pool_warnings, published_slices
    from nvdp.inventory.profile import ProfileError, load_profile
    from nvdp.plan import PlanError
    from nvdp.plan.cli import resolve_profile

    out = out or sys.stdout
    err = err or sys.stderr
    problem = check_driver_name(args.driver)
    if problem is not None:
        return _fail(err, f"--driver: {problem}")
    profile = resolve_profile(args.node)
    if not profile.is_file():
        return _fail(
            err,
            f"--node: no node profile {args.node!r}; give a profile file or the name of one in sim/profiles "
            "(e.g. t4, a100-sxm-8, h100-mig-8)",
        )
    node = args.node_name or profile.stem
    if len(node) > 253 or not _DNS_SUBDOMAIN.match(node):
        return _fail(err, f"--node-name: {node!r} is not a node name; give a lower-case DNS subdomain")
    try:
        # The preview ignores this shell's environment: the plugin's comes from the chart.
        config = load_config(args.config, {}, {})
    except ConfigError as e:
        more = f" (and {len(e.issues) - 1} more)" if len(e.issues) > 1 else ""
        return _fail(err, f"--config: {e.issues[0]}{more}")
    try:
        inventory = load_profile(profile)
    except ProfileError as e:
        return _fail(err, f"--node: {e}; correct the profile")
    try:
        devices = pool_devices(config, inventory)
    except PlanError as e:
        return _fail(err, f"--config: the config cannot be applied to node {profile.stem}'s GPUs: {e}")
    mode = node_mode(config, {DEFAULT_MODE_ENV: args.default_mode})
    for warning in pool_warnings(config, inventory, mode, default_is=f"--default-mode {args.default_mode}",
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
    json.dump(slices, out, indent=2)
    out.write("\n")
    return 0


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
