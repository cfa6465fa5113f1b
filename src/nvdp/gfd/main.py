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
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from nvdp.config.loader import ConfigError, load_config
from nvdp.config.model import Config
from nvdp.config.select import SelectionError
from nvdp.gfd.host import read_host_facts
from nvdp.gfd.labeller import labelling_pass
from nvdp.gfd.labels import HostFacts, LabelError
from nvdp.gfd.options import GFD_ENV_VARS, ProcessOptions, parse_duration, parse_options
from nvdp.gfd.publish import FileOutput, NodeFeatureOutput, NodeOutput, Output
from nvdp.inventory.model import Inventory
from nvdp.nodeconfig import NodeConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
FIRST_READ_TIMEOUT_S = 60.0
MIN_INTERVAL_S = 1.0
RETRY_S = (1.0, 60.0)  # back-off of failed publishes: first, most

log = logging.getLogger("nvdp.gfd")


class Wakeup:
    """What the main loop waits for: a deadline, a Node label change, a signal."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.stop = False
        self.reload = False

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> None:
        self._event.wait(None if math.isinf(timeout) else max(timeout, 0.0))
        self._event.clear()

    def install_signals(self) -> None:
        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info("Received signal %s, shutting down.", signal.Signals(signum).name)
            self.stop = True
            self.set()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            log.info("Received SIGHUP, reloading the config.")
            self.reload = True
            self.set()

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            signal.signal(signum, on_stop)
        signal.signal(signal.SIGHUP, on_hup)


def load(opts: ProcessOptions, env: Mapping[str, str]) -> Config:
    return load_config(opts.config_file, env, opts.overrides, env_vars=GFD_ENV_VARS)


def discover_gpus(config: Config) -> Inventory:
    from nvdp.inventory.nvml import discover

    return discover(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)


class Discovery:
    """The labelling loop; its edges (NVML, clock, output) are injectable for tests."""

    def __init__(
        self,
        opts: ProcessOptions,
        config: Config,
        output: Output,
        wake: Wakeup,
        discover: Callable[[Config], Inventory] = discover_gpus,
        reload: Callable[[], Config] | None = None,
        clock: Callable[[], float] = time.time,
        first_labels: threading.Event | None = None,
        report: Callable[[str, str], None] | None = None,
    ) -> None:
        self.opts = opts
        self.config = config
        self.output = output
        self.wake = wake
        self._discover = discover
        self._reload = reload
        self._clock = clock
        self._first_labels = first_labels
        self._report = report  # an Event on the Node, where the per-node config records them
        self._last_error: str | None = None
        self.passes = 0

    @property
    def interval_s(self) -> float:
        return max(parse_duration(self.config.flags.gfd.sleep_interval), MIN_INTERVAL_S)

    def host_facts(self, inventory: Inventory) -> HostFacts:
        return read_host_facts(inventory, self.config.flags.gfd.machine_type_file, self.opts.sysfs_root)

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
        now = None if self.config.flags.gfd.no_timestamp else int(self._clock())
        changes = self.output.publish(result.labels, now)
        self.passes += 1
        if changes:
            shown = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(changes.items()))
            log.info("labels changed: %s", shown)

    def run(self) -> int:
        inventory: Inventory | None = None
        next_read = 0.0
        retry = RETRY_S[0]
        while not self.wake.stop:
            if self.wake.reload and self._reload is not None:
                self.wake.reload = False
                try:
                    self.config = self._reload()
                    next_read = 0.0
                except (ConfigError, SelectionError) as e:
                    log.error("the new config is invalid; keeping the previous one:\n%s", e)
            now = self._clock()
            if now >= next_read:
                inventory = self.read_gpus()
                next_read = now + self.interval_s
            if self._first_labels is not None and not self._first_labels.is_set():
                if not self._first_labels.wait(FIRST_READ_TIMEOUT_S):
                    log.warning(
                        "node %s: its labels could not be read yet; still trying", self.opts.node_name
                    )
                    if self.config.flags.gfd.oneshot:
                        return EXIT_FAILED
                continue
            delay = next_read - self._clock()
            if inventory is not None:
                try:
                    self.label_once(inventory)
                    retry = RETRY_S[0]
                except LabelError as e:
                    log.error("cannot label this node: %s", e)
                except Exception as e:  # an API or file failure: keep going, try again soon
                    if self.config.flags.gfd.oneshot:
                        log.error("publishing the labels failed: %s", e)
                        return EXIT_FAILED
                    log.warning("publishing the labels failed (%s); retrying in %.0f s", e, retry)
                    delay = min(delay, retry)
                    retry = min(retry * 2, RETRY_S[1])
            if self.config.flags.gfd.oneshot:
                return EXIT_OK
            self.wake.wait(delay)
        return EXIT_OK


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


class ConfigSource:
    """Where the config comes from: one file (CONFIG_FILE), or this node's entry of CONFIG_DIR chosen by
    its `nvidia.com/device-plugin.config` label, exactly as the plugin chooses it."""

    def __init__(self, opts: ProcessOptions, env: Mapping[str, str], node_config: NodeConfig | None) -> None:
        self.opts = opts
        self.env = env
        self.node_config = node_config

    def load(self, *, initial: bool = False) -> Config:
        if self.node_config is None:
            return load(self.opts, self.env)
        try:
            chosen = self.node_config.choose(lenient=initial)
            path = str(chosen.path) if chosen.path is not None else None
            config = load_config(path, self.env, self.opts.overrides, env_vars=GFD_ENV_VARS)
        except (SelectionError, ConfigError) as e:
            self.node_config.report("InvalidConfig", f"gpu-feature-discovery: {e}")
            raise
        log.info("labelling with %s", chosen.describe())
        return config


def run(opts: ProcessOptions, env: Mapping[str, str]) -> int:
    from nvdp.inventory.nvml import NvmlUnavailable

    wake = Wakeup()
    wake.install_signals()
    labels_seen = threading.Event()
    outputs: list[NodeOutput] = []
    latest: dict[str, Mapping[str, str]] = {}

    def on_labels(labels: Mapping[str, str]) -> None:
        latest["labels"] = labels
        for out in outputs:
            out.set_current(labels)
        labels_seen.set()
        wake.set()

    def on_config_change() -> None:
        wake.reload = True
        wake.set()

    node_config = None
    if opts.node_config is not None:
        node_config = NodeConfig(opts.node_config, on_config_change, log, component="gpu-feature-discovery",
                                 on_labels=on_labels)  # fmt: skip
        node_config.start()
    source = ConfigSource(opts, env, node_config)
    watcher = None
    try:
        try:
            config = source.load(initial=True)
            output = make_output(opts, config)
        except (ConfigError, SelectionError) as e:
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
        discovery = Discovery(opts, config, output, wake, reload=source.load,
                              first_labels=labels_seen if outputs else None,
                              report=node_config.report if node_config is not None else None)  # fmt: skip
        log.info("Running with config from %s (migStrategy %s, sleepInterval %s, output %s)",
                 config.source, config.flags.mig_strategy, config.flags.gfd.sleep_interval,
                 type(output).__name__)  # fmt: skip
        try:
            return discovery.run()
        except NvmlUnavailable as e:
            log.error("%s", e)
            return EXIT_FAILED
        finally:
            keep = discovery.config.flags.gfd.oneshot or math.isinf(discovery.interval_s)
            output.close(keep)
    finally:
        if watcher is not None:
            watcher.stop()
        if node_config is not None:
            node_config.stop()


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
