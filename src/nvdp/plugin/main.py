"""`nvidia-device-plugin`: advertise a node's NVIDIA GPUs to the kubelet.

Exit status: 0 after SIGTERM/SIGINT/SIGQUIT; 1 when the plugin cannot start (invalid config, NVML
missing with failOnInitError, a config that cannot be applied to this node's GPUs, CDI specs that
cannot be made or written), with the cause and the fix in the log; 2 for command-line usage errors.

SIGHUP, and with --config-dir a change of this node's entry (nvdp.nodechoice), reloads the config,
re-reads the GPUs and re-plans: unchanged resources keep their servers, an invalid config is reported
and the previous one stays. GPUs that are down stay down across a re-plan, and across a restart when
the config names a healthStateDir (nvdp.health); each comes back by the health rules.

In DRA mode (nvdp.mode: the entry's flags.mode, else NVDP_DEFAULT_MODE) the plugin serves nothing: its
servers stop, so the kubelet marks the resources unhealthy. Entering device-plugin mode beside a DRA
plugin (DRA_DRIVER_NAME set), it advertises only once the DRA plugin's ResourceSlices for the node
are gone; a switch while GPU pods run waits for them (ModeSwitchRefused).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from nvdp import __version__
from nvdp.plugin.cdi_specs import CdiSpecs, classes, spec_dir
from nvdp.plugin.heap import settle_heap
from nvdp.plugin.logs import log_inventory, log_plan, setup_logging
from nvdp.plugin.prepare import NvmlMissing, Prepared, StartupError, idle, load_config, prepare
from nvdp.recording import Recorder
from nvdp.runloop import EXIT_FAILED, Inbox, Wake, Wakes, run

if TYPE_CHECKING:
    from nvdp.config.model import Config
    from nvdp.endpoints import HttpEndpoints
    from nvdp.health.ledger import Change, Ledger
    from nvdp.mode import Handover, ModeGate, NodeApi
    from nvdp.nodechoice import NodeConfigRule
    from nvdp.nodeconfig import Chosen, NodeConfig
    from nvdp.plugin.health import HealthMonitor
    from nvdp.plugin.kubelet_watch import KubeletSocketWatcher
    from nvdp.plugin.manager import PluginManager

# How long the first health start waits for the resources' first registration attempts (an MPS gate
# may hold a resource back for much longer; health checking does not wait for that).
HEALTH_AFTER_REGISTERING_S = 1.0


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    from nvdp.config.flags import add_config_arguments
    from nvdp.nodeconfig import add_node_config_arguments
    from nvdp.plugin import observe

    parser = argparse.ArgumentParser(
        prog="nvidia-device-plugin",
        description="Advertise this node's NVIDIA GPUs to the kubelet (device-plugin API v1beta1).",
    )
    parser.add_argument("--version", action="version", version=f"nvidia-device-plugin {__version__}")
    add_config_arguments(parser)
    observe.add_arguments(parser, os.environ if env is None else env)
    add_node_config_arguments(parser)
    return parser


class PluginProcess:
    """The plugin's life: choose and prepare a config, serve it, follow wake-ups, shut down."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str], log: logging.Logger) -> None:
        self.args = args
        self.env = env
        self.log = log
        self.manager: PluginManager | None = None
        self.watcher: KubeletSocketWatcher | None = None
        self.health: HealthMonitor | None = None
        self.ledger: Ledger | None = None  # the GPUs that are down; outlives re-plans
        # Why the plugin does not serve yet, for /readyz; None once it serves (or knowingly serves nothing).
        self.not_serving_reason: str | None = "starting"
        self.endpoints: list[HttpEndpoints] = []
        self.node_config: NodeConfig | None = None
        self.rule: NodeConfigRule | None = None
        # The node's mode (nvdp.mode), and a device-plugin config held back until the DRA plugin's
        # slices are gone (with the wait that says when).
        self.gate: ModeGate | None = None
        self.held: Prepared | None = None
        self.handover: Handover | None = None
        # The process's one Recorder (metrics and Node Events); every part that records is given it.
        self.recorder = Recorder()
        self._why = "Received SIGHUP"
        self.specs = CdiSpecs(spec_dir(env), log)

    # --- putting a config in force (the `switch` of nvdp.nodechoice) ----------------------------

    def prepare(self, chosen: Chosen | None) -> Prepared:
        """Config, mode, GPUs, plan and CDI specs; raises StartupError / NvmlMissing, or the mode gate's
        ConfigRefused (a mode switch that may not happen now), changing nothing."""
        from nvdp.mode import follower_mode

        path = chosen.path if chosen is not None else None
        config = load_config(self.args, self.env, path, per_node=self.node_config is not None)
        self.log.info("Configuration from %s%s", config.source, f", {chosen.describe()}" if chosen else "")
        mode = follower_mode(config, self.env)
        assert self.gate is not None
        self.gate.check(mode)
        if mode == "dra":  # the DRA plugin serves this node's GPUs: read nothing, advertise nothing
            prepared = idle(config, mode, "this node is in DRA mode: the DRA plugin serves its GPUs")
        else:
            prepared = prepare(config)
        return prepared

    def start_with(self, chosen: Chosen | None) -> None:
        """The first config: serve it, or raise ConfigRefused (invalid) / NvmlMissing as they are."""
        from nvdp.nodechoice import ConfigRefused

        try:
            prepared = self.prepare(chosen)
            self.specs.stage(prepared.cdi)  # before any resource registers, held back or not
        except StartupError as err:
            raise ConfigRefused(str(err)) from None
        assert self.gate is not None
        self.gate.enter(prepared.mode)
        self.record_active(prepared, chosen)
        self.serve(self.hold(prepared, entering=True))

    def hold(self, prepared: Prepared, *, entering: bool) -> Prepared:
        """What to serve now: `prepared`, or nothing while the DRA plugin still publishes this node's
        GPUs (`prepared` is then held until its slices are gone: `release_held`)."""
        from nvdp.mode import Handover

        entering = entering or self.handover is not None  # a reload while waiting keeps waiting
        self.held = self.handover = None
        api = self.gate.api if self.gate is not None else None
        if prepared.mode != "device-plugin" or not entering or api is None or api.driver is None:
            return prepared

        def slices() -> str | None:
            left = api.slices_left()
            return f"{left} ResourceSlice(s) of driver {api.driver} for node {api.node}" if left else None

        handover = Handover("the DRA plugin to delete this node's ResourceSlices", slices, self.log)
        if handover.done():
            return prepared
        self.held, self.handover = prepared, handover
        return idle(prepared.config, prepared.mode, "waiting for the DRA plugin to delete this node's "
                                                    "ResourceSlices")

    def release_held(self) -> None:
        """The DRA plugin let go: serve the held config."""
        held, self.held, self.handover = self.held, None, None
        assert held is not None
        if self.manager is None:
            self.serve(held)
        else:
            self.apply(held, notify=False)
        if self.gate is not None:
            self.gate.advertising()

    def reload(self, chosen: Chosen | None) -> None:
        """Re-plan from a fresh config and GPU list; on any error raise ConfigRefused, serving as before."""
        from nvdp.nodechoice import ConfigRefused

        notify = self.node_config is None  # per-node config reports InvalidConfig with the entry's name
        why = f"{self._why}; config {chosen.describe()}" if chosen is not None else self._why
        self.log.info("%s: reloading the configuration and re-reading the GPUs", why)
        try:
            prepared = self.prepare(chosen)
            self.specs.stage(prepared.cdi)  # the CDI specs first: a failure leaves everything as it was
        except ConfigRefused:
            raise  # a mode switch that waits (or needs a restart): nothing changed, the rule reports it
        except (StartupError, NvmlMissing) as err:
            self.recorder.config_refused(str(err), time.time(), notify=notify)
            raise ConfigRefused(str(err)) from None
        except Exception as err:  # whatever went wrong, a reload must not take a serving plugin down
            error = f"{type(err).__name__}: {err}"
            self.recorder.config_refused(error, time.time(), notify=notify)
            self.log.exception("Reload failed unexpectedly (%s); still serving the previous configuration",
                               error)
            raise ConfigRefused(error) from None
        assert self.gate is not None
        switching = self.gate.mode != prepared.mode
        self.gate.enter(prepared.mode)
        prepared = self.hold(prepared, entering=switching)
        self.record_active(prepared, chosen)
        if self.manager is None:
            self.recorder.config_applied(prepared.config.source, "first configuration served", True,
                                         time.time(), notify=notify)
            self.serve(prepared)
        else:
            self.apply(prepared, notify)
        if prepared.idle is None:
            self.gate.advertising()

    def apply(self, prepared: Prepared, notify: bool) -> None:
        assert self.manager is not None
        log_plan(self.log, prepared.plan)
        if self.health is not None:
            self.health.stop()
            self.health = None
        diff = self.manager.apply(prepared.plan, prepared.config, prepared.inventory, classes(prepared.cdi))
        self.specs.settle(prepared.cdi)
        self.log.info("Reload applied: %s", diff.describe())
        changed = bool(diff.added or diff.removed or diff.changed or diff.restarted)
        self.recorder.config_applied(prepared.config.source, diff.describe(), changed, time.time(),
                                     notify=notify)
        self.watch_kubelet(prepared.config)
        if prepared.idle is None:
            self.start_health(prepared)
        self.log_idle(prepared)
        settle_heap(collect=True)

    def log_idle(self, prepared: Prepared) -> None:
        if prepared.idle is not None:
            self.log.info("Advertising nothing: %s.", prepared.idle)
        elif not prepared.plan.resources:
            self.log.info("No devices found. Waiting indefinitely.")

    # --- serving -----------------------------------------------------------------------------

    def serve(self, prepared: Prepared) -> None:
        from nvdp.plugin.manager import PluginManager

        if prepared.idle is None:
            log_inventory(self.log, prepared.inventory)
        log_plan(self.log, prepared.plan)
        self.specs.stage(prepared.cdi)  # before any resource registers; raises StartupError
        self.manager = PluginManager(prepared.config, prepared.inventory, self.log, recorder=self.recorder)
        if prepared.idle is None:  # GPUs down before a restart are down from the first list on
            self.manager.set_health(self.open_ledger(prepared.config).unhealthy, "as before the restart")
        self.watch_kubelet(prepared.config)
        self.manager.apply(prepared.plan, cdi_classes=classes(prepared.cdi))
        # Health checking starts once the resources have registered (or tried to), as in NVIDIA's
        # plugin: its set-up, NVML event registration for every GPU, would otherwise compete with
        # registering for the interpreter. Like an XID before start-up, one in those milliseconds
        # goes unseen (NVML keeps events only for event sets registered before them).
        self.manager.wait_first_attempts(HEALTH_AFTER_REGISTERING_S)
        if prepared.idle is None:
            self.start_health(prepared)
        self.not_serving_reason = None
        self.log_idle(prepared)
        settle_heap(collect=False)

    def watch_kubelet(self, config: Config) -> None:
        from nvdp.plugin.kubelet_watch import KubeletSocketWatcher

        path = config.flags.plugin.kubelet_socket_path
        if self.watcher is not None:
            if self.watcher.socket_path == path:
                return
            self.watcher.stop()
        manager = self.manager
        assert manager is not None

        def kubelet_restarted() -> None:
            self.recorder.kubelet_restart()
            manager.kubelet_restarted()

        self.watcher = KubeletSocketWatcher(path, kubelet_restarted, self.log)
        self.watcher.start()

    def open_ledger(self, config: Config) -> Ledger:
        from nvdp.health.settings import open_ledger

        self.ledger = open_ledger(config, self.log, self.ledger)
        return self.ledger

    def start_health(self, prepared: Prepared) -> None:
        from nvdp.plugin.health import monitor_for

        manager = self.manager
        assert manager is not None
        if self.health is not None:
            self.health.stop()
            self.health = None

        def on_health(unhealthy: frozenset[str], changes: Sequence[Change]) -> None:
            manager.set_health(unhealthy, "; ".join(sorted({c.reason for c in changes})))

        self.health = monitor_for(prepared.config, prepared.inventory, self.open_ledger(prepared.config),
                                  on_health, self.log, recorder=self.recorder, writer="nvidia-device-plugin")
        self.health.start()

    def record_active(self, prepared: Prepared, chosen: Chosen | None) -> None:
        """The config going in force, for nvdp_config_active. Set before any resource registers, so a
        scrape that sees the resources also sees the config they come from."""
        entry = (chosen.entry or "") if chosen is not None else ""
        self.recorder.config_active(prepared.config.source, entry)

    # --- the process -------------------------------------------------------------------------

    def start_node_config(self, inbox: Inbox) -> None:
        """Follow the node label and the entries directory (CONFIG_DIR mode only)."""
        from nvdp.mode import ModeGate
        from nvdp.nodechoice import NodeConfigRule
        from nvdp.nodeconfig import follow

        self.node_config = follow(self.args, self.env, lambda: inbox.post(Wake.NODE_CONFIG), self.log,
                                  recorder=self.recorder)
        report = self.node_config.report if self.node_config is not None else None
        self.rule = NodeConfigRule(self.node_config, report or (lambda *a, **k: None), self.log)
        self.gate = ModeGate("device-plugin", self.node_api(), self.report, self.log,
                             per_node=self.node_config is not None)

    def report(self, reason: str, message: str, *, warning: bool = True) -> None:
        """Log, and record an Event on the Node."""
        from nvdp.nodechoice import node_report

        node_report(self.node_config, self.recorder, self.log)(reason, message, warning=warning)

    def node_api(self) -> NodeApi | None:
        """The API reads of the mode policy: with per-node config, or beside a DRA plugin (whose slices
        it waits for); None without a node name or API access."""
        from nvdp.config.names import node_name
        from nvdp.mode import NodeApi, driver_name

        driver, node = driver_name(self.env), node_name(self.env)
        if not node or (self.node_config is None and driver is None):
            return None  # and no API client imported: a single-config plugin never talks to the API
        from nvdp.kube import KubeConnectError, connect

        try:
            client = connect(self.args.kubeconfig)
        except KubeConnectError as err:
            if driver is not None:
                self.log.warning("Cannot read the API server (%s): this node's ResourceSlices of driver %s "
                                 "are not checked before advertising", err, driver)
            return None
        return NodeApi(client, node, driver)

    def start(self, inbox: Inbox) -> int | None:
        """Put the first config in force; an exit code when the plugin cannot start."""
        from nvdp.config.select import SelectionError
        from nvdp.nodechoice import ConfigRefused

        try:
            self.start_node_config(inbox)
            assert self.rule is not None
            self.rule.start(self.start_with)
        except (StartupError, ConfigRefused, SelectionError) as err:
            self.log.error("%s", err)
            return EXIT_FAILED
        except NvmlMissing as err:
            if err.fail:
                self.log.error("%s", err)
                self.log.error("Exiting: failOnInitError is true (set it to false to keep the plugin running "
                               "without GPUs on this node)")
                return EXIT_FAILED
            self.log.warning("%s", err)
            self.log.warning("failOnInitError is false: serving nothing; send SIGHUP to retry")
            self.not_serving_reason = None
            self.log.info("No devices found. Waiting indefinitely.")
        return None

    def on_wake(self, wakes: Wakes) -> int | None:
        assert self.rule is not None
        if Wake.RELOAD in wakes or Wake.NODE_CONFIG in wakes:  # a burst of changes re-plans once
            forced = Wake.RELOAD in wakes
            self._why = "Received SIGHUP" if forced else "Node config changed"
            self.rule.again(self.reload, forced=forced)
        elif self.rule.retry_due():  # a mode switch that waited for GPU pods to go
            self._why = "Trying the pending config again"
            self.rule.again(self.reload, forced=False)
        if self.handover is not None and self.handover.done():
            self.release_held()
        return None

    def wake_after(self) -> float | None:
        """How long the loop may sleep: while waiting for the DRA plugin or retrying a pending switch."""
        from nvdp.mode import HANDOVER_POLL_S

        delays = [HANDOVER_POLL_S] if self.handover is not None else []
        retry = self.rule.retry_in() if self.rule is not None else None
        if retry is not None:
            delays.append(retry)
        return min(delays) if delays else None

    def run(self, inbox: Inbox) -> int:
        from nvdp.node_events import NodeEvents
        from nvdp.plugin import observe
        from nvdp.plugin.state import ServingView

        try:
            self.endpoints = observe.start(ServingView(self), self.args, self.log, self.recorder)
        except OSError as err:
            self.log.error("%s; choose another port (--metrics-address / --health-address)", err)
            return EXIT_FAILED
        self.recorder.attach_events(NodeEvents.from_env(self.env, self.log))
        try:
            failed = self.start(inbox)
            return failed if failed is not None else run(inbox, self.on_wake, self.log, self.wake_after)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()
        self.recorder.close()
        if self.node_config is not None:
            self.node_config.stop()
        if self.health is not None:
            # Do not wait out the health thread's NVML wait: the process is about to exit anyway.
            self.health.stop(timeout=0)
        if self.watcher is not None:
            self.watcher.stop()
        if self.manager is not None:
            self.log.info("Stopping plugins.")
            self.manager.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from nvdp.plugin import observe

    observe.check_addresses(parser, args)
    log = setup_logging()
    log.info("Starting NVIDIA device plugin (nvdp %s)", __version__)
    inbox = Inbox()
    from nvdp.plugin.guard import on_fatal

    on_fatal(inbox.post_fatal)
    try:
        return PluginProcess(args, os.environ, log).run(inbox)
    finally:
        on_fatal(None)
        inbox.close()


if __name__ == "__main__":
    sys.exit(main())
