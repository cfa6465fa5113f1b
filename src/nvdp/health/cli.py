"""`nvdp health`: show the GPUs that are down on this node, or clear them by hand.

Run in the plugin's container (`kubectl exec`), where the health record's directory is mounted;
`--state-dir` defaults to $HEALTH_STATE_DIR as the chart sets it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

from nvdp.health.state import FILE, StateError, down_gpus, read_state, request_clear

ENV = "HEALTH_STATE_DIR"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "health", help="show the GPUs that are down on this node, or clear them by hand",
        description="Show the GPUs the plugin holds down on this node (from its health record), or ask "
                    "it to bring some back: `nvdp health clear GPU-...` (or `--all`) once the cause is "
                    "fixed. The plugin takes the request within a second and says so in a GPUCleared Event.")
    parser.add_argument("--state-dir", metavar="DIR", default=os.environ.get(ENV, ""),
                        help=f"the plugin's healthStateDir (default: ${ENV})")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    show = actions.add_parser("show", help="list the GPUs that are down (the default)")
    show.add_argument("--json", action="store_true", help="print the record as JSON")
    clear = actions.add_parser("clear", help="bring GPUs back by hand")
    clear.add_argument("gpus", nargs="*", metavar="GPU_UUID", help="the GPUs to clear")
    clear.add_argument("--all", action="store_true", help="clear every GPU that is down")
    parser.set_defaults(handler=run, action="show", json=False)


def run(args: argparse.Namespace) -> int:
    directory = args.state_dir
    if not directory:
        print(f"nvdp health: no health record directory: pass --state-dir, or set {ENV} (the chart's "
              "devicePlugin.healthRecovery.stateDir, /run/nvidia/nvdp by default)", file=sys.stderr)
        return 2
    try:
        record = read_state(directory)
    except StateError as err:
        print(f"nvdp health: {err}", file=sys.stderr)
        return 1
    if args.action == "clear":
        return clear(args, directory, record)
    if args.json:
        print(json.dumps(record or {}, indent=2, sort_keys=True))
        return 0
    gpus = down_gpus(record)
    if not gpus:
        where = "" if record else f" (no {FILE} in {directory} yet)"
        print(f"No GPU is down{where}.")
        return 0
    for gpu, entry in sorted(gpus.items()):
        since = datetime.datetime.fromtimestamp(float(entry.get("since", 0)), datetime.timezone.utc)
        print(f"{gpu}  {entry.get('state')}  since {since:%Y-%m-%d %H:%M:%S}Z  {entry.get('reason')}")
        if entry.get("blocked"):
            print(f"    kept down: {entry['blocked']}")
    return 0


def clear(args: argparse.Namespace, directory: str, record: dict[str, Any] | None) -> int:
    if bool(args.gpus) == bool(args.all):
        print("nvdp health clear: name the GPUs to clear (their UUIDs), or pass --all", file=sys.stderr)
        return 2
    down = set(down_gpus(record))
    unknown = [gpu for gpu in args.gpus if gpu not in down]
    if unknown:
        listed = ", ".join(sorted(down)) or "none"
        print(f"nvdp health clear: not down on this node: {', '.join(unknown)} (down: {listed})",
              file=sys.stderr)
        return 1
    try:
        request_clear(directory, [] if args.all else list(args.gpus))
    except (OSError, ValueError) as err:
        print(f"nvdp health clear: {err}", file=sys.stderr)
        return 1
    print(f"Asked the plugin to clear {'every GPU that is down' if args.all else ', '.join(args.gpus)}; "
          "it does so within a second (a GPUCleared Event on the Node).")
    return 0
