"""`nvidia-device-plugin`: advertise a node's NVIDIA GPUs to the kubelet.

Exit status: 0 after SIGTERM/SIGINT/SIGQUIT; 1 when the plugin cannot start (invalid config, NVML
missing with failOnInitError, a config that cannot be applied to this node's GPUs), with the cause
and the fix in the log; 2 for command-line usage errors.

SIGHUP reloads the config, re-reads the GPUs and re-plans. Servers of unchanged resources keep
running; an invalid new config is reported and the previous one stays in force. A re-plan is also
the way to clear devices marked Unhealthy (nothing else brings them back, as in NVIDIA's plugin).

With --config-dir (CONFIG_DIR) the config is one entry of a directory, chosen by this node's label
`nvidia.com/device-plugin.config`, else DEFAULT_CONFIG, else FALLBACK_STRATEGIES (nvdp.nodeconfig).
A label change or an edit of the chosen entry re-plans through the same path as SIGHUP; a label
naming a missing or invalid entry leaves the running config in place and is recorded as an Event.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from msgspec import Struct

from nvdp import __version__, recording
from nvdp.config.model import Config
from nvdp.inventory.model import Inventory
from nvdp.plan.model import Plan

if TYPE_CHECKING:
    from nvdp.endpoints import HttpEndpoints
    from nvdp.nodeconfig import Chosen, NodeConfig
    from nvdp.plugin.health import HealthMonitor
    from nvdp.plugin.kubelet_watch import KubeletSocketWatcher
    from nvdp.plugin.manager import PluginManager
    from nvdp.plugin.node_events import NodeEvents

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Posted to the signal pipe by the per-node config threads; above every signal number.
NODE_CONFIG_CHANGED = 250
# How long the first health start waits for the resources' first registration attempts (an MPS gate
# may hold a resource back for much longer; health checking does not wait for that).
HEALTH_AFTER_REGISTERING_S = 1.0
FATAL = 0  # not a signal number: posted on the signal pipe when the process must exit with a failure


class StartupError(Exception):
    """Why the plugin cannot serve with the current config and node; the message has the fix."""


class Prepared(Struct, frozen=True):
    config: Config
    inventory: Inventory
    plan: Plan


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


class SignalInbox:
    """Signals arrive as bytes on a pipe (signal.set_wakeup_fd), so the main loop can block in select()."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in (signal.SIGHUP, *STOP_SIGNALS):
            signal.signal(signum, self._ignore)

    @staticmethod
    def _ignore(signum: int, frame: FrameType | None) -> None:
        # The wakeup fd carries the signal; the handler only has to exist.
        return None

    def post(self, code: int) -> None:
        """Wake the main loop from another thread, like a signal would (a one-byte write is atomic)."""
        # A full pipe already holds wake-ups, so the main loop will run anyway.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, bytes([code]))

    def wait(self, timeout: float | None = None) -> list[int]:
        """Every signal received since the last call (all that queued up, in order); [] on timeout."""
        ready, _, _ = select.select([self._read], [], [], timeout)
        if not ready:
            return []
        received: list[int] = []
        while True:
            try:
                chunk = os.read(self._read, 4096)
            except BlockingIOError:
                return received
            received.extend(chunk)
            if len(chunk) < 4096:
                return received

    def post_fatal(self) -> None:
        """Wake the main loop to exit with a failure (a guarded thread died); safe from any thread."""
        with contextlib.suppress(OSError):
            os.write(self._write, bytes([FATAL]))

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        os.close(self._read)
        os.close(self._write)


class PluginProcess:
    """The plugin's life: prepare (config, GPUs, plan), serve, react to signals, shut down."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str], log: logging.Logger) -> None:
        self.args = args
        self.env = env
        self.log = log
        self.manager: PluginManager | None = None
        self.watcher: KubeletSocketWatcher | None = None
        self.health: HealthMonitor | None = None
        # Why the plugin does not serve yet, for /readyz; None once it serves (or knowingly serves nothing).
        self.not_serving_reason: str | None = "starting"
        self.endpoints: list[HttpEndpoints] = []
        self.events: NodeEvents | None = None
        self.node_config: NodeConfig | None = None
        self.chosen: Chosen | None = None
        self.rejected: Chosen | None = None

    # --- preparing ---------------------------------------------------------------------------

    def load_config(self) -> Config:
        from nvdp.config.flags import overrides_from_args
        from nvdp.config.loader import ConfigError, load_config

        path, env = self.args.config_file, self.env
        if self.node_config is not None:
            assert self.chosen is not None
            # The entry chosen for this node, or none at all ("empty"): never CONFIG_FILE.
            path = str(self.chosen.path) if self.chosen.path is not None else None
            env = {k: v for k, v in self.env.items() if k != "CONFIG_FILE"}
        try:
            return load_config(path, env, overrides_from_args(self.args))
        except ConfigError as err:
            raise StartupError(str(err)) from None

    def discover(self, config: Config) -> Inventory:
        from nvdp.inventory.nvml import NvmlUnavailable, discover

        try:
            return discover(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)
        except NvmlUnavailable as err:
            raise NvmlMissing(str(err)) from None

    def make_plan(self, config: Config, inventory: Inventory) -> Plan:
        from nvdp.plan import PlanError, plan
        from nvdp.plugin.wire import oversized

        try:
            planned = plan(config, inventory)
        except PlanError as err:
            raise StartupError(f"the configuration cannot be applied to this node's GPUs: {err}") from None
        too_big = [reason for reason in map(oversized, planned.resources) if reason]
        if too_big:
            raise StartupError("the configuration cannot be served on this node: " + "; ".join(too_big))
        return planned

    def prepare(self) -> Prepared:
        config = self.load_config()
        chosen = f", {self.chosen.describe()}" if self.chosen is not None else ""
        self.log.info("Configuration from %s%s", config.source, chosen)
        try:
            inventory = self.discover(config)
        except NvmlMissing as err:
            err.fail = config.flags.fail_on_init_error
            raise
        return Prepared(config, inventory, self.make_plan(config, inventory))

    # --- serving -----------------------------------------------------------------------------

    def serve(self, prepared: Prepared) -> None:
        from nvdp.plugin.kubelet_watch import KubeletSocketWatcher
        from nvdp.plugin.manager import PluginManager

        log_inventory(self.log, prepared.inventory)
        log_plan(self.log, prepared.plan)
        self.manager = PluginManager(prepared.config, prepared.inventory, self.log)
        self.watch_kubelet(prepared.config, KubeletSocketWatcher)
        self.manager.apply(prepared.plan)
        # Health checking starts once the resources have registered (or tried to), as in NVIDIA's
        # plugin: its set-up, NVML event registration for every GPU, would otherwise compete with
        # registering for the interpreter. Like an XID before start-up, one in those milliseconds
        # goes unseen (NVML keeps events only for event sets registered before them).
        self.manager.wait_first_attempts(HEALTH_AFTER_REGISTERING_S)
        self.start_health(prepared)
        self.not_serving_reason = None
        recording.config_active(prepared.config.source, self.entry())
        if not prepared.plan.resources:
            self.log.info("No devices found. Waiting indefinitely.")
        settle_heap(collect=False)

    def watch_kubelet(self, config: Config, watcher_type: type[KubeletSocketWatcher]) -> None:
        path = config.flags.plugin.kubelet_socket_path
        if self.watcher is not None:
            if self.watcher.socket_path == path:
                return
            self.watcher.stop()
        manager = self.manager
        assert manager is not None

        def kubelet_restarted() -> None:
            recording.kubelet_restart()
            manager.kubelet_restarted()

        self.watcher = watcher_type(path, kubelet_restarted, self.log)
        self.watcher.start()

    def start_health(self, prepared: Prepared) -> None:
        from nvdp.plugin.health import HealthMonitor
        from nvdp.plugin.xid_policy import policy_from_config

        manager = self.manager
        assert manager is not None
        if self.health is not None:
            self.health.stop()
        self.health = HealthMonitor(prepared.inventory, policy_from_config(prepared.config),
                                    manager.mark_unhealthy, self.log)
        self.health.start()

    def reload(self, why: str = "Received SIGHUP") -> str | None:
        """Re-plan from a fresh config and GPU list; on any error keep serving as before.

        Returns None when applied, else the error (already logged).
        """
        self.log.info("%s: reloading the configuration and re-reading the GPUs", why)
        try:
            prepared = self.prepare()
        except (StartupError, NvmlMissing) as err:
            # Per-node config records its own event for this (InvalidConfig, with the entry's name).
            recording.config_refused(str(err), time.time(), notify=self.node_config is None)
            self.log.error("Reload failed; still serving the previous configuration.\n%s", err)
            return str(err)
        except Exception as err:  # whatever went wrong, a reload must not take a serving plugin down
            error = f"{type(err).__name__}: {err}"
            recording.config_refused(error, time.time(), notify=self.node_config is None)
            self.log.exception("Reload failed unexpectedly (%s: %s); still serving the previous "
                               "configuration", type(err).__name__, err)
            return error
        if self.manager is None:
            recording.config_applied(prepared.config.source, "first configuration served", True, time.time(),
                                     notify=self.node_config is None)
            self.serve(prepared)
            return None
        from nvdp.plugin.kubelet_watch import KubeletSocketWatcher

        log_plan(self.log, prepared.plan)
        if self.health is not None:
            self.health.stop()
            self.health = None
        diff = self.manager.apply(prepared.plan, prepared.config, prepared.inventory)
        self.log.info("Reload applied: %s", diff.describe())
        changed = bool(diff.added or diff.removed or diff.changed or diff.restarted)
        recording.config_applied(prepared.config.source, diff.describe(), changed, time.time(),
                                 notify=self.node_config is None)
        recording.config_active(prepared.config.source, self.entry())
        self.watch_kubelet(prepared.config, KubeletSocketWatcher)
        self.start_health(prepared)
        if not prepared.plan.resources:
            self.log.info("No devices found. Waiting indefinitely.")
        settle_heap(collect=True)
        return None

    # --- per-node config ---------------------------------------------------------------------

    def start_node_config(self, inbox: SignalInbox) -> None:
        """Start following the node label and the entries directory (CONFIG_DIR mode only)."""
        from nvdp.config.select import SelectionError
        from nvdp.nodeconfig import NodeConfig, settings_from

        try:
            settings = settings_from(self.args, self.env)
        except SelectionError as err:
            raise StartupError(str(err)) from None
        if settings is None:
            return
        if self.args.config_file:
            self.log.warning("--config-file is ignored: --config-dir (CONFIG_DIR) picks the config per node")
        self.node_config = NodeConfig(settings, lambda: inbox.post(NODE_CONFIG_CHANGED), self.log)
        self.node_config.start()
        try:
            self.chosen = self.node_config.choose(lenient=True)
        except SelectionError as err:
            raise StartupError(str(err)) from None

    def prepare_first(self) -> Prepared:
        """Start-up: a label naming an invalid entry must not keep the node from serving its default."""
        try:
            return self.prepare()
        except StartupError as err:
            node_config, chosen = self.node_config, self.chosen
            if node_config is None or chosen is None or chosen.selection.reason != "label":
                raise
            from nvdp.config.select import SelectionError

            try:
                fallback = node_config.without_label()
            except (SelectionError, OSError):
                raise err from None
            node_config.report("InvalidConfig", f"config entry {chosen.entry!r} chosen by the node label is "
                               f"invalid; starting with {fallback.describe()} instead:\n{err}")
            self.rejected, self.chosen = chosen, fallback
            return self.prepare()

    def reselect(self, why: str) -> None:
        """The label, the entries or SIGHUP: choose again; re-plan when the choice or its content changed."""
        from nvdp.config.select import SelectionError, UnknownEntry

        node_config, current = self.node_config, self.chosen
        assert node_config is not None and current is not None
        try:
            chosen = node_config.choose()
        except SelectionError as err:
            reason = "UnknownConfig" if isinstance(err, UnknownEntry) else "ConfigSelectionFailed"
            node_config.report(reason, f"{err}; still serving {current.describe()}")
            if why == "Received SIGHUP":
                self.reload(why)
            return
        if chosen == current and why != "Received SIGHUP":
            return
        if chosen == self.rejected and why != "Received SIGHUP":
            return  # already tried and reported; wait for the label or the entry to change
        self.chosen = chosen
        error = self.reload(f"{why}; config {chosen.describe()}")
        if error is None:
            self.rejected = None
            if chosen.entry != current.entry or chosen.digest != current.digest:
                node_config.report("ConfigApplied", f"now serving {chosen.describe()}, "
                                   f"previously {current.describe()}", warning=False)
            return
        self.chosen, self.rejected = current, chosen
        node_config.report("InvalidConfig", f"config {chosen.describe()} was not applied; still serving "
                           f"{current.describe()}:\n{error}")

    def shutdown(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()
        if self.events is not None:
            recording.set_events(None)
            self.events.close()
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

    def entry(self) -> str:
        """The per-node config entry in force ("" with a single config file)."""
        return (self.chosen.entry or "") if self.chosen is not None else ""

    def start_endpoints(self) -> bool:
        from nvdp.plugin import observe

        try:
            self.endpoints = observe.start(self, self.args, self.log)
        except OSError as err:
            self.log.error("%s; choose another port (--metrics-address / --health-address)", err)
            return False
        return True

    def run(self, inbox: SignalInbox) -> int:
        from nvdp.plugin.node_events import NodeEvents

        if not self.start_endpoints():
            return EXIT_FAILED
        self.events = NodeEvents.from_env(self.env, self.log)
        recording.set_events(self.events)
        try:
            self.start_node_config(inbox)
            prepared = self.prepare_first()
        except StartupError as err:
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
        else:
            self.serve(prepared)
        try:
            while True:
                received = inbox.wait()
                # A stop signal goes first, however many reloads queued up before it.
                stop = next((s for s in received if s in STOP_SIGNALS), None)
                if stop is not None:
                    self.log.info("Received signal %s, shutting down.", signal.Signals(stop).name)
                    return EXIT_OK
                if FATAL in received:
                    self.log.error("Exiting so that the kubelet restarts the plugin (see the error above)")
                    return EXIT_FAILED
                reloads = received.count(signal.SIGHUP)
                if reloads:
                    if reloads > 1:
                        self.log.info("%d SIGHUPs arrived together; reloading once", reloads)
                    if self.node_config is not None:
                        self.reselect("Received SIGHUP")
                    else:
                        self.reload()
                elif NODE_CONFIG_CHANGED in received:  # a burst of label or entry changes re-plans once
                    self.reselect("Node config changed")
        finally:
            self.shutdown()


class NvmlMissing(Exception):
    """NVML could not be initialised; `fail` says whether the config wants the plugin to exit."""

    fail = True


def settle_heap(collect: bool) -> None:
    """Freeze what start-up (or a reload) left on the heap out of the cyclic GC.

    Everything loaded at start lives as long as the process. Unfrozen, each full collection walks
    all of it (~30k objects) and stalls whichever Allocate triggered it for milliseconds; frozen,
    collections only see what was made since. Freezing is O(1). At start-up there is next to no
    cyclic garbage to collect first (16 objects measured) and a collection would stall the first
    health event or Allocate for ~8 ms, so only a reload, which replaces plan and servers, unfreezes
    and collects before freezing again.
    """
    if collect:
        gc.unfreeze()
        gc.collect()
    gc.freeze()


def log_inventory(log: logging.Logger, inventory: Inventory) -> None:
    log.info("NVML: driver %s, CUDA %s, %d GPU(s)", inventory.driver_version, inventory.cuda_driver_version,
             len(inventory.gpus))
    for gpu in inventory.gpus:
        mig = f"MIG enabled, {len(gpu.mig_devices)} MIG device(s)" if gpu.mig_enabled else "MIG disabled"
        log.info("GPU %d: %s, %s, %d MiB, %s", gpu.index, gpu.name, gpu.uuid, gpu.memory_bytes >> 20, mig)
        for mig_device in gpu.mig_devices:
            log.info("  MIG %s: %s, %s, %d MiB", mig_device.index_id, mig_device.profile, mig_device.uuid,
                     mig_device.memory_bytes >> 20)
    for lost in inventory.lost:
        log.warning("GPU %d (%s) is not usable: %s", lost.index, lost.uuid or "UUID unknown", lost.reason)


def log_plan(log: logging.Logger, plan: Plan) -> None:
    from nvdp.plugin.manager import describe_resource

    for warning in plan.warnings:
        log.warning("%s", warning)
    for excluded in plan.excluded:
        log.info("Not advertised: %s: %s", excluded.device, excluded.reason)
    for resource in plan.resources:
        log.info("Resource %s", describe_resource(resource))


def setup_logging() -> logging.Logger:
    # The log format uses none of the caller, thread or process fields; not collecting them (the
    # logging module's documented switches) makes each record, one per Allocate, about a third cheaper.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return logging.getLogger("nvidia-device-plugin")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from nvdp.plugin import observe

    observe.check_addresses(parser, args)
    log = setup_logging()
    log.info("Starting NVIDIA device plugin (nvdp %s)", __version__)
    inbox = SignalInbox()
    from nvdp.plugin.guard import on_fatal

    on_fatal(inbox.post_fatal)
    try:
        return PluginProcess(args, os.environ, log).run(inbox)
    finally:
        on_fatal(None)
        inbox.close()


if __name__ == "__main__":
    sys.exit(main())
