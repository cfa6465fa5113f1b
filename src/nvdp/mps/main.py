"""`mps-control-daemon`: runs one NVIDIA MPS control daemon per resource the config shares with MPS.

It reads the same config as the plugin and plans the same resources, so the daemon and the plugin
agree on names, GPUs and replicas. An MPS root that cannot hold the daemons' state stops start-up
(exit 1, with the fix) before any compute mode changes. SIGTERM stops every daemon (compute modes
back to DEFAULT, readiness markers removed) and exits 0, or 1 if a compute mode could not be
restored; SIGHUP reloads the config and starts over.

With CONFIG_DIR it follows the same per-node choice as the plugin (node label, DEFAULT_CONFIG,
FALLBACK_STRATEGIES; nvdp.daemon.pernode.nodeconfig): a node switched to an MPS entry gets its daemons
started, one
switched away gets them stopped. Only a change of the chosen entry or its content restarts daemons.
A node in DRA mode (nvdp.daemon.pernode.mode) gets no daemons here: the DRA plugin runs MPS for its claims
itself; a
switch between the modes waits, as the plugins' does, until no pod uses the node's GPUs.

`mps-control-daemon mount-shm` mounts the tmpfs MPS clients share as /dev/shm (the chart's init container);
with the host's PID namespace it does so in the host's mount namespace (no Bidirectional propagation, see
nvdp.mps.node.hostmount). On its final stop the daemon removes what only a running daemon needs from the host:
each resource's pipe folder and readiness marker, and the tmpfs it mounted (`mps-control-daemon
unmount-shm`; pods that still use it keep it until they end). The bounded log folder stays.

In both modes a pod starts daemons only once it holds its node (nvdp.mps.node.handover): the new pod of a
rolling update waits beside the old one, Ready only while no pod of the node uses MPS, and takes over
when the old one ends; the old pod's final stop then leaves the host's MPS state to it.

`mps-control-daemon --dra-driver NAME` (env MPS_DRA_DRIVER; the chart's `<release>-dra-mps` DaemonSet)
runs the daemons of DRA claims instead, from the orders the DRA plugin writes under
`<MPS root>/NAME/orders` (nvdp.mps.ordered): in a pod of their own, they outlive a restart, crash or
upgrade of the DRA plugin with their MPS servers and clients. No config is read then (config flags
are ignored, but for the driver root that NVML is loaded from).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from nvdp import __version__
from nvdp.daemon.pernode.nodeconfig import add_node_config_arguments, settings_from
from nvdp.daemon.report.endpoints import HttpEndpoints, parse_address
from nvdp.daemon.skeleton import Skeleton
from nvdp.mps.node.host_setup import build_mount_parser, mount_shm, unmount_shm
from nvdp.mps.paths import container_root
from nvdp.mps.supervisor import DEFAULT_PROBE_INTERVAL_S
from nvdp.mps.work import MpsDaemonWork

PROG = "mps-control-daemon"
PROBE_INTERVAL_ENV = "MPS_PROBE_INTERVAL"
METRICS_ADDRESS_ENV = "METRICS_ADDRESS"
DRA_DRIVER_ENV = "MPS_DRA_DRIVER"
# Where NVML is loaded from in --dra-driver mode, which reads no config: the config's flag and variables.
DRIVER_ROOT_ENVS = ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT")
DEFAULT_CONTAINER_DRIVER_ROOT = "/driver-root"
log = logging.getLogger("nvdp.mps")


def env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


def build_parser() -> argparse.ArgumentParser:
    from nvdp.config.flags import ENV_RULE, ScreenHelp, add_config_arguments

    parser = argparse.ArgumentParser(
        formatter_class=ScreenHelp,
        prog=PROG,
        description=f"{__doc__.split(chr(10) * 2)[0]} {ENV_RULE}",
        epilog=f"`{PROG} mount-shm [--dry-run]` mounts the tmpfs MPS clients share as /dev/shm.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "--metrics-address", default=os.environ.get(METRICS_ADDRESS_ENV) or None, metavar="HOST:PORT",
        help="serve Prometheus metrics at /metrics, e.g. :9446; off by default",
    )
    add_node_config_arguments(parser)
    parser.add_argument(
        "--dra-driver", default=os.environ.get(DRA_DRIVER_ENV) or None, metavar="NAME",
        help="run the MPS daemons the DRA driver NAME orders under <MPS root>/NAME/orders instead of the "
        f"config's (env {DRA_DRIVER_ENV}); config arguments are then ignored",
    )
    add_config_arguments(parser, listed=False)
    return parser


def serve_metrics(skeleton: Skeleton, address: str | None) -> list[HttpEndpoints]:
    """The daemon's series at /metrics, recorded by the skeleton's Recorder (no probes). Should the
    server's thread end, the daemon ends through its run loop (its pod restarts), saying why."""
    from nvdp.daemon.report.observe import scrape, serve

    def died(what: str) -> None:
        log.critical("%s stopped unexpectedly; the MPS daemon ends so that its pod restarts", what)
        if skeleton.inbox is not None:
            skeleton.inbox.post_fatal()

    return serve(address, None, {}, scrape(skeleton.recorder, "MPS_DAEMON"), skeleton.recorder, log,
                 on_death=died)


def container_driver_root(args: argparse.Namespace) -> str:
    """Where NVML is loaded from without a config: --driver-root-ctr-path, its variables, the default."""
    given = getattr(args, "driver_root_ctr_path", None)
    from_env = [os.environ.get(name) for name in DRIVER_ROOT_ENVS]
    return next((root for root in (given, *from_env) if root), DEFAULT_CONTAINER_DRIVER_ROOT)


def run_ordered(args: argparse.Namespace, driver: str) -> int:
    """The daemons of DRA claims, as the DRA plugin orders them (metrics as in the other mode)."""
    from functools import partial

    from nvdp.mps.compute_mode import NvmlComputeModes
    from nvdp.mps.ordered.work import OrderedDaemonsWork

    skeleton = Skeleton(PROG, log, os.environ, guard=False)
    work = OrderedDaemonsWork(skeleton, container_root(), driver,
                              env_seconds(PROBE_INTERVAL_ENV, DEFAULT_PROBE_INTERVAL_S),
                              partial(NvmlComputeModes, container_driver_root(args)))
    log.info("%s %s (the MPS daemons of DRA driver %s)", PROG, __version__, driver)
    if args.config_file or getattr(args, "config_dir", None) or os.environ.get("CONFIG_DIR"):
        log.info("--dra-driver: the config is not read; the DRA plugin's orders say what runs")
    return skeleton.run(work, serve=lambda: serve_metrics(skeleton, args.metrics_address),
                        serve_fix="choose another --metrics-address")


def run(args: argparse.Namespace) -> int:
    if args.dra_driver:
        return run_ordered(args, args.dra_driver)
    # The daemon's metrics, no Events (the plugin records those for this node; it only logs them).
    skeleton = Skeleton(PROG, log, os.environ, kubeconfig=args.kubeconfig, guard=False)
    settings = settings_from(args, os.environ)
    work = MpsDaemonWork(skeleton, args, container_root(), env_seconds(PROBE_INTERVAL_ENV,
                                                                       DEFAULT_PROBE_INTERVAL_S), settings)
    log.info("%s %s", PROG, __version__)
    return skeleton.run(work, settings=settings, config_file=args.config_file,
                        serve=lambda: serve_metrics(skeleton, args.metrics_address),
                        serve_fix="choose another --metrics-address")


def main(argv: Sequence[str] | None = None) -> int:
    from nvdp.daemon.report.logs import setup_logging

    setup_logging(log.name, keep_handlers=True)
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["mount-shm"]:
        return mount_shm(build_mount_parser().parse_args(arguments[1:]).dry_run)
    if arguments[:1] == ["unmount-shm"] and len(arguments) == 3 and arguments[1].isdigit():
        return unmount_shm(int(arguments[1]), Path(arguments[2]))
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.metrics_address is not None:
        try:
            parse_address(args.metrics_address)
        except ValueError as err:
            parser.error(f"--metrics-address: {err}")
    if args.dra_driver is not None and (args.dra_driver in ("", ".", "..") or "/" in args.dra_driver):
        # It names a folder of the MPS root: one path part, as DRA driver names (DNS names) are.
        parser.error(f"--dra-driver: {args.dra_driver!r} is not a DRA driver name")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
