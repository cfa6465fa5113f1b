"""`mps-control-daemon`: runs one NVIDIA MPS control daemon per resource the config shares with MPS.

It reads the same config as the plugin and plans the same resources, so the daemon and the plugin
agree on names, GPUs and replicas. An MPS root that cannot hold the daemons' state stops start-up
(exit 1, with the fix) before any compute mode changes. SIGTERM stops every daemon (compute modes
back to DEFAULT, readiness markers removed) and exits 0, or 1 if a compute mode could not be
restored; SIGHUP reloads the config and starts over.

With CONFIG_DIR it follows the same per-node choice as the plugin (node label, DEFAULT_CONFIG,
FALLBACK_STRATEGIES; nvdp.nodeconfig): a node switched to an MPS entry gets its daemons started, one
switched away gets them stopped. Only a change of the chosen entry or its content restarts daemons.
A node in DRA mode (nvdp.mode) gets no daemons here: the DRA plugin runs MPS for its claims itself; a
switch between the modes waits, as the plugins' does, until no pod uses the node's GPUs.

`mps-control-daemon mount-shm` mounts the tmpfs MPS clients share as /dev/shm (the chart's init container);
with the host's PID namespace it does so in the host's mount namespace (no Bidirectional propagation, see
nvdp.mps.hostmount). On its final stop the daemon removes what only a running daemon needs from the host:
each resource's pipe folder and readiness marker, and the tmpfs it mounted (`mps-control-daemon
unmount-shm`; pods that still use it keep it until they end). The bounded log folder stays.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from nvdp import __version__, runloop
from nvdp.endpoints import HttpEndpoints, Response, parse_address
from nvdp.mode import ModeGate, NodeApi, driver_name, follower_mode
from nvdp.mps.commands import MpsConfigError, MpsSettings
from nvdp.mps.compute_mode import ComputeModeError, ComputeModes, NvmlComputeModes
from nvdp.mps.daemons import Daemons, plan_mps
from nvdp.mps.host_setup import build_mount_parser, clean_up, mount_shm, unmount_shm
from nvdp.mps.paths import ResourcePaths, container_root, unusable_root, unusable_root_message
from nvdp.mps.supervisor import DEFAULT_PROBE_INTERVAL_S
from nvdp.nodeconfig import Chosen, NodeConfig, add_node_config_arguments, follow
from nvdp.recording import Recorder
from nvdp.runloop import Inbox, Wake, Wakes

PROG = "mps-control-daemon"
PROBE_INTERVAL_ENV = "MPS_PROBE_INTERVAL"
METRICS_ADDRESS_ENV = "METRICS_ADDRESS"
log = logging.getLogger("nvdp.mps")


def env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


def build_parser() -> argparse.ArgumentParser:
    from nvdp.config.flags import add_config_arguments

    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog=f"`{PROG} mount-shm [--dry-run]` mounts the tmpfs MPS clients share as /dev/shm.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_config_arguments(parser)
    parser.add_argument(
        "--metrics-address", default=os.environ.get(METRICS_ADDRESS_ENV) or None, metavar="HOST:PORT",
        help=f"serve Prometheus metrics at /metrics, e.g. :9446 (env {METRICS_ADDRESS_ENV}); off by default",
    )
    add_node_config_arguments(parser)
    return parser


def start_metrics(address: str, recorder: Recorder, inbox: Inbox | None = None) -> HttpEndpoints:
    """Serve the daemon's series, recorded by `recorder`; OSError when the address cannot be bound.
    Should the server's thread end, the daemon ends through `inbox` (its pod restarts), saying why."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    series = recorder.enable_metrics()

    def scrape() -> Response:
        return Response(200, generate_latest(series.MPS_DAEMON), CONTENT_TYPE_LATEST)

    def died(what: str) -> None:
        log.critical("%s stopped unexpectedly; the MPS daemon ends so that its pod restarts", what)
        if inbox is not None:
            inbox.post_fatal()

    server = HttpEndpoints(address, {"/metrics": scrape}, log, on_death=died)
    server.start()
    return server


def load_settings(
    args: argparse.Namespace, chosen: Chosen | None = None, gate: ModeGate | None = None,
) -> tuple[str, list[MpsSettings], Callable[[], ComputeModes]]:
    """Config source and MPS settings; raises the config, inventory, plan or MPS error as is, or the
    mode gate's ConfigRefused (a mode switch that must wait). No settings in DRA mode.

    `chosen`: the per-node entry (CONFIG_DIR mode), which replaces --config-file / CONFIG_FILE.
    """
    from nvdp.config.flags import overrides_from_args
    from nvdp.config.loader import entry_in_force, load_config
    from nvdp.inventory.nvml import discover

    path, env = entry_in_force(args.config_file, os.environ, chosen.path if chosen is not None else None,
                               per_node=chosen is not None)
    config = load_config(path, env, overrides_from_args(args))
    modes_factory = partial(NvmlComputeModes, config.flags.plugin.container_driver_root)
    mode = follower_mode(config, os.environ)
    if gate is not None:
        gate.check(mode)
    if mode == "dra":
        source, settings = f"{config.source} (DRA mode: the DRA plugin runs MPS for its claims)", []
    else:
        inventory = discover(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)
        source, settings = config.source, plan_mps(config, inventory)
    if gate is not None:
        gate.enter(mode)
    return source, settings, modes_factory


def start_errors() -> tuple[type[BaseException], ...]:
    from nvdp.config.loader import ConfigError
    from nvdp.config.select import SelectionError
    from nvdp.inventory.nvml import NvmlUnavailable
    from nvdp.plan import PlanError

    return (ConfigError, NvmlUnavailable, PlanError, MpsConfigError, ComputeModeError, SelectionError)


def root_problem(root: Path, settings: Sequence[MpsSettings]) -> str | None:
    """Why no daemon could work under `root`, checked before any GPU's compute mode is touched."""
    for item in settings:
        problem = unusable_root(root, ResourcePaths(root, item.resource_name).base)
        if problem is not None:
            return unusable_root_message(root, problem)
    return None


class CannotStart(Exception):
    """The daemons cannot run on this node whatever the config (the MPS root, a compute mode)."""


class MpsDaemonProcess:
    """Puts the chosen config's daemons in force (the `switch` of nvdp.nodechoice) and stops them."""

    def __init__(
        self, args: argparse.Namespace, root: Path, probe_interval: float, recorder: Recorder
    ) -> None:
        self.args = args
        self.root = root
        self.probe_interval = probe_interval
        self.recorder = recorder
        self.current: Daemons | None = None
        # The node's mode; the plugins record its Events, this daemon only logs (nvdp.mode).
        self.gate = ModeGate(None, None, _log_only, log)

    def switch(self, chosen: Chosen | None) -> None:
        from nvdp.nodechoice import ConfigRefused

        if chosen is not None:
            log.info("per-node config: %s", chosen.describe())
        try:
            source, settings, modes_factory = load_settings(self.args, chosen, self.gate)
        except start_errors() as err:
            raise ConfigRefused(str(err)) from None
        unusable = root_problem(self.root, settings)
        if unusable is not None and self.current is None:
            # Exit so the pod shows the failure (CrashLoopBackOff) instead of looking Running.
            raise CannotStart(unusable)
        if self.current is not None:
            log.info("reloading: stopping the running MPS daemons")
            self.current.stop()
        log.info("config: %s", source)
        self.current = Daemons(settings, self.root, modes_factory, log, self.probe_interval,
                               recorder=self.recorder)
        if not settings:
            log.info("no resource is shared with MPS in %s; nothing to do", source)
        for item in settings:
            log.info("resource %s", item.describe())
        try:
            self.current.start()
        except ComputeModeError as err:
            raise CannotStart(str(err)) from None

    def stop(self) -> int:
        """The final stop: daemons down, compute modes back to DEFAULT, host state cleaned up."""
        log.info("stopping")
        stopping, self.current = self.current, None
        restored = stopping.stop() if stopping is not None else True
        if stopping is not None:
            clean_up(stopping.settings, self.root)
        if not restored:
            log.error("stopped, but a GPU's compute mode could not be restored to DEFAULT (see above)")
            return 1
        return 0


def run(args: argparse.Namespace) -> int:
    from nvdp.config.select import SelectionError
    from nvdp.nodechoice import ConfigRefused, NodeConfigRule

    inbox = Inbox()
    probe_interval = env_seconds(PROBE_INTERVAL_ENV, DEFAULT_PROBE_INTERVAL_S)
    # The daemon's one Recorder: its metrics, no Events (the plugin records those for this node).
    recorder = Recorder()
    process = MpsDaemonProcess(args, container_root(), probe_interval, recorder)
    log.info("%s %s", PROG, __version__)
    metrics: HttpEndpoints | None = None
    node_config: NodeConfig | None = None
    try:
        if args.metrics_address:
            try:
                metrics = start_metrics(args.metrics_address, recorder, inbox)
            except OSError as err:
                log.error("cannot listen on %s: %s; choose another --metrics-address", args.metrics_address,
                          err.strerror or err)
                return 1
        try:
            # The plugin records the Events for this node; the daemon only logs them.
            node_config = follow(args, os.environ, lambda: inbox.post(Wake.NODE_CONFIG), log)
            rule = NodeConfigRule(node_config, node_config.report if node_config else _log_only, log)
            process.gate = ModeGate(None, node_api(node_config), _log_only, log,
                                    per_node=node_config is not None)
            rule.start(process.switch)
        except (ConfigRefused, SelectionError, CannotStart) as err:
            log.error("cannot start: %s", err)
            return 1

        def on_wake(wakes: Wakes) -> int | None:
            try:
                if Wake.RELOAD in wakes or Wake.NODE_CONFIG in wakes:
                    rule.again(process.switch, forced=Wake.RELOAD in wakes)
                elif rule.retry_due():  # a mode switch that waited for GPU pods to go
                    rule.again(process.switch, forced=False)
            except CannotStart as err:
                log.error("cannot start: %s", err)
                return 1
            return None

        code = runloop.run(inbox, on_wake, log, rule.retry_in)
        return process.stop() if code == 0 else code
    finally:
        inbox.close()
        if node_config is not None:
            node_config.stop()
        if process.current is not None:
            process.current.stop()
        if metrics is not None:
            metrics.stop()


def _log_only(reason: str, message: str, *, warning: bool = True) -> None:
    (log.warning if warning else log.info)("%s: %s", reason, message)


def node_api(node_config: NodeConfig | None) -> NodeApi | None:
    """The mode policy's API reads (the pods on this node): with per-node config only, where the mode
    can change while the daemon runs."""
    from nvdp.kube import KubeConnectError, connect

    settings = node_config.settings if node_config is not None else None
    if settings is None or not settings.node_name:
        return None
    try:
        return NodeApi(connect(settings.kubeconfig), settings.node_name, driver_name(os.environ))
    except KubeConnectError as err:
        log.warning("cannot read the pods on this node (%s): a switch to or from DRA mode needs a restart",
                    err)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
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
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
