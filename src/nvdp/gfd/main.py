"""`gpu-feature-discovery`: label this node with its GPUs' features, NVIDIA's label set.

NVML -> Inventory, config -> Plan (the plugin's), both -> labels -> one output: the Node's own
labels (default), an NFD NodeFeature object (`useNodeFeatureAPI: true`) or NFD's features.d file
(`useNodeFeatureAPI: false`). NVML is re-read every `sleepInterval`; the Node is watched, so a config
label switched by the user (`nvidia.com/device-plugin.config`) relabels at once. Writes happen only
when the label set changes. `--presence-only` runs the NVML-free presence check instead.

Exit status: 0 after oneshot or SIGTERM/SIGINT/SIGQUIT; 1 when it cannot start (invalid config, NVML
missing with failOnInitError, no node name for Node labels, API unreachable in oneshot); 2 for usage
errors. SIGHUP reloads the config.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from nvdp import runloop
from nvdp.config.loader import ConfigError, entry_in_force, load_config
from nvdp.config.model import Config
from nvdp.config.select import SelectionError
from nvdp.gfd.host import read_host_facts
from nvdp.gfd.labeller import labelling_pass
from nvdp.gfd.labels import HostFacts, LabelError
from nvdp.gfd.options import GFD_ENV_VARS, ProcessOptions, parse_duration, parse_options
from nvdp.gfd.publish import FileOutput, NodeFeatureOutput, NodeOutput, Output
from nvdp.health.state import FILE as HEALTH_FILE
from nvdp.inventory.model import Inventory
from nvdp.mode import ModeGate, NodeApi, driver_name, follower_mode
from nvdp.nodeconfig import Chosen, NodeConfig
from nvdp.recording import Recorder
from nvdp.runloop import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Inbox, Wake, Wakes

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
FIRST_READ_TIMEOUT_S = 60.0
MIN_INTERVAL_S = 1.0
RETRY_S = (1.0, 60.0)  # back-off of failed publishes: first, most
# How often the plugin's health record is looked at (one stat) between passes, so that the health
# labels follow a GPU going down or coming back within seconds, not at the next sleepInterval.
HEALTH_POLL_S = 2.0

log = logging.getLogger("nvdp.gfd")


def load(opts: ProcessOptions, env: Mapping[str, str]) -> Config:
    return load_config(opts.config_file, env, opts.overrides, env_vars=GFD_ENV_VARS)


def discover_gpus(config: Config) -> Inventory:
    from nvdp.inventory.nvml import discover

    return discover(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)


class Discovery:
    """One labelling pass per wake-up or interval; its edges (NVML, clock, output) are injectable for tests.

    `step` is the run loop's step (nvdp.runloop); `timeout` says when the next pass is due.
    """

    def __init__(
        self,
        opts: ProcessOptions,
        config: Config,
        output: Output,
        discover: Callable[[Config], Inventory] = discover_gpus,
        clock: Callable[[], float] = time.monotonic,
        first_labels: threading.Event | None = None,
        report: Callable[[str, str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.opts = opts
        self.config = config
        self.output = output
        self._discover = discover
        self._clock = clock
        self._wall_clock = wall_clock
        self._first_labels = first_labels
        self._report = report  # an Event on the Node, where the per-node config records them
        self._last_error: str | None = None
        self._started = clock()
        self._waiting_warned = False
        self._next_read = 0.0
        self._retry = RETRY_S[0]
        self._delay: float = 0.0
        self.inventory: Inventory | None = None
        self.passes = 0
        self._health_stamp: tuple[int, int] | None = None  # the record's (mtime, size) at the last pass

    @property
    def interval_s(self) -> float:
        return max(parse_duration(self.config.flags.gfd.sleep_interval), MIN_INTERVAL_S)

    def use(self, config: Config) -> None:
        """A new config: read the GPUs again on the next pass."""
        self.config = config
        self._next_read = 0.0

    def host_facts(self, inventory: Inventory) -> HostFacts:
        return read_host_facts(inventory, self.config.flags.gfd.machine_type_file, self.opts.sysfs_root,
                               self.config.flags.plugin.health_state_dir)

    def health_unchanged(self) -> bool:
        """Whether the health record is as at the last pass (always true without one configured)."""
        directory = self.config.flags.plugin.health_state_dir
        if not directory:
            return True
        try:
            info = os.stat(os.path.join(directory, HEALTH_FILE))
            stamp: tuple[int, int] | None = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        unchanged = stamp == self._health_stamp
        self._health_stamp = stamp
        return unchanged

    def read_gpus(self) -> Inventory | None:
        from nvdp.inventory.nvml import NvmlUnavailable

        try:
            return self._discover(self.config)
        except NvmlUnavailable as e:
            if self.config.flags.fail_on_init_error:
                raise
            log.error("%s; failOnInitError is false: keeping the current labels, retrying in %s", e,
                      self.config.flags.gfd.sleep_interval)  # fmt: skip
            return None

    def label_once(self, inventory: Inventory) -> None:
        result = labelling_pass(self.config, inventory, self.host_facts(inventory))
        if result.plan_error != self._last_error:
            if result.plan_error:
                message = (f"the config cannot apply to this node's GPUs, so the plugin advertises nothing "
                           f"and the labels show no sharing: {result.plan_error}")  # fmt: skip
                log.error("%s", message)
                if self._report is not None:
                    self._report("InvalidConfig", f"gpu-feature-discovery: {message}")
            self._last_error = result.plan_error
        now = None if self.config.flags.gfd.no_timestamp else int(self._wall_clock())
        changes = self.output.publish(result.labels, now)
        self.passes += 1
        if changes:
            shown = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(changes.items()))
            log.info("labels changed: %s", shown)

    def timeout(self) -> float:
        return self._delay

    def _poll_delay(self) -> float:
        until_read = self._next_read - self._clock()
        return min(until_read, HEALTH_POLL_S) if self.config.flags.plugin.health_state_dir else until_read

    def step(self, wakes: Wakes | None = None) -> int | None:
        """One pass: read NVML when due, label, and say when to come back; an exit code ends the loop."""
        oneshot = self.config.flags.gfd.oneshot
        now = self._clock()
        due = now >= self._next_read
        health_unchanged = self.health_unchanged()
        settled = self.passes > 0 and self._retry == RETRY_S[0]  # labelled, and no failed publish to retry
        if wakes is not None and wakes.timed_out and not due and health_unchanged and settled:
            self._delay = self._poll_delay()
            return None  # a health poll that found nothing new
        if due:
            self.inventory = self.read_gpus()
            self._next_read = now + self.interval_s
        if self._first_labels is not None and not self._first_labels.is_set():
            # Nothing to compare with yet: come back when the labels arrive (Wake.LABELS) or soon.
            waited = self._clock() - self._started
            if waited >= FIRST_READ_TIMEOUT_S and not self._waiting_warned:
                log.warning("node %s: its labels could not be read yet; still trying", self.opts.node_name)
                self._waiting_warned = True
                if oneshot:
                    return EXIT_FAILED
            self._delay = 1.0
            return None
        self._delay = self._poll_delay()
        if self.inventory is not None:
            try:
                self.label_once(self.inventory)
                self._retry = RETRY_S[0]
            except LabelError as e:
                log.error("cannot label this node: %s", e)
            except Exception as e:  # an API or file failure: keep going, try again soon
                if oneshot:
                    log.error("publishing the labels failed: %s", e)
                    return EXIT_FAILED
                log.warning("publishing the labels failed (%s); retrying in %.0f s", e, self._retry)
                self._delay = min(self._delay, self._retry)
                self._retry = min(self._retry * 2, RETRY_S[1])
        return EXIT_OK if oneshot else None


def make_output(opts: ProcessOptions, config: Config) -> Output:
    """The output the config asks for: the features.d file, a NodeFeature object or the Node."""
    use_nfd_api = config.flags.use_node_feature_api
    if use_nfd_api is False:
        return FileOutput(config.flags.gfd.output_file)
    if not opts.node_name:
        raise StartupError(
            "no node name: set NODE_NAME (the chart sets it from spec.nodeName) or --node-name; "
            "or set useNodeFeatureAPI to false to write NFD's features.d file instead"
        )
    from nvdp.kube import KubeConnectError, connect

    try:
        client = connect(opts.kubeconfig)
    except KubeConnectError as e:
        raise StartupError(str(e)) from None
    if use_nfd_api:
        return NodeFeatureOutput(client, opts.node_name, opts.namespace)
    return NodeOutput(client, opts.node_name)


class StartupError(Exception):
    """The labeller cannot start; the message says why and what to change."""


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)


class ConfigLoader:
    """The `switch` of nvdp.nodechoice for the labeller: load the chosen entry (or the config file).

    The labels come from the same plan in either mode (nvdp.mode); a switch between the modes waits,
    as the plugins' does, until no pod uses the node's GPUs, so the labels describe what is served.
    """

    def __init__(self, opts: ProcessOptions, env: Mapping[str, str]) -> None:
        self.opts = opts
        self.env = env
        self.config: Config | None = None
        self.discovery: Discovery | None = None
        # The plugins record the mode's Events; the labeller only logs.
        self.gate = ModeGate(None, None, _log_only, log)

    def switch(self, chosen: Chosen | None) -> None:
        from nvdp.nodechoice import ConfigRefused

        try:
            if self.opts.node_config is None:
                config = load(self.opts, self.env)
            else:
                assert chosen is not None
                path, env = entry_in_force(self.opts.config_file, self.env, chosen.path, per_node=True)
                config = load_config(path, env, self.opts.overrides, env_vars=GFD_ENV_VARS)
        except ConfigError as e:
            raise ConfigRefused(str(e)) from None
        mode = follower_mode(config, self.env)
        self.gate.check(mode)
        self.gate.enter(mode)
        if chosen is not None:
            log.info("labelling with %s", chosen.describe())
        self.config = config
        if self.discovery is not None:
            self.discovery.use(config)


def run(opts: ProcessOptions, env: Mapping[str, str]) -> int:
    from nvdp.inventory.nvml import NvmlUnavailable
    from nvdp.nodechoice import ConfigRefused, NodeConfigRule

    inbox = Inbox()
    labels_seen = threading.Event()
    outputs: list[NodeOutput] = []
    latest: dict[str, Mapping[str, str]] = {}

    def on_labels(labels: Mapping[str, str]) -> None:
        latest["labels"] = labels
        for out in outputs:
            out.set_current(labels)
        labels_seen.set()
        inbox.post(Wake.LABELS)

    node_config = None
    watcher = None
    loader = ConfigLoader(opts, env)
    recorder = Recorder()
    try:
        if opts.node_config is not None:
            from nvdp.node_events import NodeEvents

            recorder.attach_events(NodeEvents.from_env(env, log, component="gpu-feature-discovery",
                                                       node_name=opts.node_name, kubeconfig=opts.kubeconfig))
            node_config = NodeConfig(opts.node_config, lambda: inbox.post(Wake.NODE_CONFIG), log,
                                     recorder=recorder, on_labels=on_labels)  # fmt: skip
            node_config.start()
        rule = NodeConfigRule(node_config, node_config.report if node_config is not None else _log_only, log)
        loader.gate = ModeGate(None, node_api(opts, env), _log_only, log, per_node=node_config is not None)
        try:
            rule.start(loader.switch)
            assert loader.config is not None
            output = make_output(opts, loader.config)
        except (ConfigRefused, SelectionError) as e:
            log.error("invalid configuration:\n%s", e)
            return EXIT_FAILED
        except StartupError as e:
            log.error("%s", e)
            return EXIT_FAILED
        if isinstance(output, NodeOutput):
            outputs.append(output)
            if "labels" in latest:
                output.set_current(latest["labels"])
            if node_config is None:  # otherwise the per-node config's watch already follows the Node
                from nvdp.kube import NodeWatcher, connect

                watcher = NodeWatcher(connect(opts.kubeconfig), opts.node_name, lambda n: on_labels(n.labels))
                watcher.start()
        discovery = Discovery(opts, loader.config, output, first_labels=labels_seen if outputs else None,
                              report=node_config.report if node_config is not None else None)  # fmt: skip
        loader.discovery = discovery
        log.info("Running with config from %s (migStrategy %s, sleepInterval %s, output %s)",
                 loader.config.source, loader.config.flags.mig_strategy,
                 loader.config.flags.gfd.sleep_interval, type(output).__name__)  # fmt: skip

        def step(wakes: Wakes) -> int | None:
            if Wake.RELOAD in wakes or Wake.NODE_CONFIG in wakes:
                rule.again(loader.switch, forced=Wake.RELOAD in wakes)
            elif rule.retry_due():  # a mode switch that waited for GPU pods to go
                rule.again(loader.switch, forced=False)
            return discovery.step(wakes)

        def timeout() -> float:
            retry = rule.retry_in()
            return discovery.timeout() if retry is None else min(discovery.timeout(), retry)

        try:
            first = discovery.step()
            return first if first is not None else runloop.run(inbox, step, log, timeout)
        except NvmlUnavailable as e:
            log.error("%s", e)
            return EXIT_FAILED
        finally:
            keep = discovery.config.flags.gfd.oneshot or math.isinf(discovery.interval_s)
            output.close(keep)
    finally:
        inbox.close()
        if watcher is not None:
            watcher.stop()
        if node_config is not None:
            node_config.stop()
        recorder.close()


def _log_only(reason: str, message: str, *, warning: bool = True) -> None:
    (log.warning if warning else log.info)("%s: %s", reason, message)


def node_api(opts: ProcessOptions, env: Mapping[str, str]) -> NodeApi | None:
    """The mode policy's API reads (the pods on this node), with per-node config only."""
    from nvdp.kube import KubeConnectError, connect

    if opts.node_config is None or not opts.node_name:
        return None
    try:
        return NodeApi(connect(opts.kubeconfig), opts.node_name, driver_name(env))
    except KubeConnectError as err:
        log.warning("cannot read the pods on this node (%s): a switch to or from DRA mode needs a restart",
                    err)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    import os

    setup_logging()
    try:
        opts = parse_options(argv)
    except SelectionError as e:  # FALLBACK_STRATEGIES names an unknown strategy
        log.error("%s", e)
        return EXIT_USAGE
    if opts.presence_only:
        from nvdp.gfd.presence import run_presence

        return run_presence(opts)
    return run(opts, os.environ)


if __name__ == "__main__":
    sys.exit(main())
