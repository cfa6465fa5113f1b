"""`nvdp health`: show the GPUs that are down on this node, or clear them by hand.

Run in the plugin's container (`kubectl exec`), where the health record's folder is mounted:
`--state-dir` defaults to $HEALTH_STATE_DIR, which the chart sets, else to the chart's default
folder. A clear is reported done only once the plugin has taken the request and its record shows
the GPUs back; a request no plugin takes is withdrawn, and said so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from nvdp.health.state import FILE, StateError, down_gpus, read_state, request_clear

ENV = "HEALTH_STATE_DIR"
# The chart's devicePlugin.healthRecovery.stateDir (tests/health/test_cli.py holds the two equal).
CHART_STATE_DIR = "/run/nvidia/nvdp"
# The plugin takes clear requests within a second (nvdp.daemon.health.RECHECK_EVERY_S).
WAIT_S = 5.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, e.g. 5")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "health", help="show the GPUs that are down on this node, or clear them by hand",
        description="Show the GPUs the plugin holds down on this node (from its health record), or ask "
                    "it to bring some back: `nvdp health clear GPU-...` (or `--all`) once the cause is "
                    "fixed. The plugin takes the request within a second and says so in a GPUCleared Event.")
    _add_state_dir(parser, os.environ.get(ENV) or CHART_STATE_DIR)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    show = actions.add_parser("show", help="show the GPUs that are down (the default)",
                              description="Show the GPUs that are down, each with its state, since when "
                                          "and why.")
    _add_state_dir(show)
    show.add_argument("--json", action="store_true", help="print the record as JSON")
    clear = actions.add_parser("clear", help="bring GPUs back by hand",
                               description="Ask the plugin to bring GPUs back, and wait until its record "
                                           "shows them back (exit 0), or say what did not happen (exit 1).")
    _add_state_dir(clear)
    clear.add_argument("gpus", nargs="*", metavar="GPU_UUID", help="the GPUs to clear")
    clear.add_argument("--all", action="store_true", help="clear every GPU that is down")
    clear.add_argument("--wait", type=_seconds, default=WAIT_S, metavar="SECONDS",
                       help="how long to wait for the plugin to take the request (default %(default)g)")
    parser.set_defaults(handler=run, action="show", json=False)


def _add_state_dir(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--state-dir, taken before the action and after it (there without a default, so that one given
    before stays)."""
    parser.add_argument("--state-dir", metavar="DIR",
                        default=argparse.SUPPRESS if default is None else default,
                        help=f"the plugin's healthStateDir (default: ${ENV}, else {CHART_STATE_DIR})")


def run(args: argparse.Namespace) -> int:
    directory = args.state_dir
    if not os.path.isdir(directory):
        print(f"nvdp health: no health record folder {directory}: run this in the plugin's pod "
              f"(`kubectl exec <plugin pod> -- nvdp health`), or pass --state-dir (or set {ENV}) to the "
              "plugin's healthStateDir (the chart's devicePlugin.healthRecovery.stateDir)", file=sys.stderr)
        return 1
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
    if not down:
        print(f"No GPU is down in {directory}: nothing to clear.")
        return 0
    wanted = sorted(down) if args.all else list(args.gpus)
    try:
        requests = request_clear(directory, [] if args.all else wanted)
    except (OSError, ValueError) as err:
        print(f"nvdp health clear: {err}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + args.wait
    if not _taken(requests, deadline):
        print(f"nvdp health clear: no plugin took the request within {args.wait:g} s, so nothing was cleared "
              f"and the request is withdrawn; run this where the plugin runs (`kubectl exec <plugin pod> -- "
              f"nvdp health clear ...`), with its healthStateDir ({directory} here)", file=sys.stderr)
        return 1
    # The plugin writes its record right after taking the request: a moment, however late it took it.
    still = _still_down(directory, wanted, max(deadline, time.monotonic() + 2.0))
    if still:
        print(f"nvdp health clear: the plugin took the request, but its record still shows down: "
              f"{', '.join(still)}; see `nvdp health` and the plugin's log", file=sys.stderr)
        return 1
    print(f"Cleared {', '.join(wanted)}: the plugin serves {'them' if len(wanted) > 1 else 'it'} again "
          "(a GPUCleared Event on the Node).")
    return 0


def _taken(requests: list[Path], deadline: float) -> bool:
    """Whether the plugin took every request file before `deadline`; those it did not take are
    withdrawn (one the plugin takes meanwhile counts as taken)."""
    while any(path.exists() for path in requests) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = 0
    for path in requests:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        left += 1
    return left == 0


def _still_down(directory: str, gpus: list[str], deadline: float) -> list[str]:
    """The GPUs of `gpus` the record still shows down once it is rewritten, or at `deadline`."""
    while True:
        try:
            down = set(down_gpus(read_state(directory)))
        except StateError:
            down = set(gpus)
        still = [gpu for gpu in gpus if gpu in down]
        if not still or time.monotonic() >= deadline:
            return still
        time.sleep(0.05)

