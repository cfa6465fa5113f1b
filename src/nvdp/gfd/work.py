"""GPU feature discovery's own work on the daemon skeleton: its config, its output, its passes.

`switch` (the per-node rule's, nvdp.daemon.pernode.nodechoice) loads the chosen entry or the config file. The
labels
come from the same plan in either mode (nvdp.daemon.pernode.mode); a switch between the modes waits, as the
plugins'
does, until no pod uses the node's GPUs, so the labels describe what is served. `begin` opens the
output the config asks for and makes the first pass; each wake-up makes the next (nvdp.gfd.discovery).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nvdp.config.loader import ConfigError, entry_in_force, load_config
from nvdp.config.model import Config
from nvdp.daemon.api import PODS_UNREADABLE
from nvdp.daemon.errors import StartupError
from nvdp.daemon.pernode.mode import driver_name, follower_mode
from nvdp.daemon.podresources import kubelet_pods_from
from nvdp.daemon.runloop import EXIT_FAILED, Wake, Wakes
from nvdp.daemon.skeleton import DaemonWork, Skeleton
from nvdp.gfd.discovery import Discovery, load, log
from nvdp.gfd.options import GFD_ENV_VARS, ProcessOptions
from nvdp.gfd.publish import FileOutput, NodeFeatureOutput, NodeOutput, Output

if TYPE_CHECKING:
    from nvdp.daemon.pernode.mode import NodeApi
    from nvdp.daemon.pernode.nodeconfig import Chosen
    from nvdp.kube import NodeWatcher


def make_output(opts: ProcessOptions, config: Config, client: Callable[[], Any] | None = None) -> Output:
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
        api = client() if client is not None else connect(opts.kubeconfig)
    except KubeConnectError as e:
        raise StartupError(str(e)) from None
    if use_nfd_api:
        return NodeFeatureOutput(api, opts.node_name, opts.namespace)
    return NodeOutput(api, opts.node_name)


class GfdWork(DaemonWork):
    """The labeller's config, output and passes; the Node's labels as they arrive (`on_labels`)."""

    def __init__(self, skeleton: Skeleton, opts: ProcessOptions, env: Mapping[str, str]) -> None:
        self.skeleton = skeleton
        self.opts = opts
        self.env = env
        self.config: Config | None = None
        self.output: Output | None = None
        self.discovery: Discovery | None = None
        self.watcher: NodeWatcher | None = None
        self.labels_seen = threading.Event()
        self._node_outputs: list[NodeOutput] = []
        self._latest: Mapping[str, str] | None = None

    def on_labels(self, labels: Mapping[str, str]) -> None:
        """The Node's labels changed (the per-node config's watch, or the labeller's own)."""
        self._latest = labels
        for out in self._node_outputs:
            out.set_current(labels)
        self.labels_seen.set()
        if self.skeleton.inbox is not None:
            self.skeleton.inbox.post(Wake.LABELS)

    def mode_api(self) -> NodeApi | None:
        """The mode policy's API reads (the pods on this node), with per-node config only."""
        if self.opts.node_config is None or not self.opts.node_name:
            return None
        return self.skeleton.api.node_api(self.opts.node_name, driver_name(self.env), log,
                                          unreachable=PODS_UNREADABLE,
                                          kubelet_pods=kubelet_pods_from(self.env))

    def switch(self, chosen: Chosen | None) -> None:
        from nvdp.daemon.pernode.nodechoice import ConfigRefused

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
        gate = self.skeleton.gate
        assert gate is not None
        gate.check(mode)
        gate.enter(mode)
        if chosen is not None:
            log.info("labelling with %s", chosen.describe())
        self.config = config
        if self.discovery is not None:
            self.discovery.use(config)

    def begin(self) -> int | None:
        """Open the output, follow the Node's labels where the output compares with them, label once."""
        config = self.config
        assert config is not None
        output = self.output = make_output(self.opts, config, self.skeleton.api.client)
        if isinstance(output, NodeOutput):
            self._node_outputs.append(output)
            if self._latest is not None:
                output.set_current(self._latest)
            if self.skeleton.node_config is None:  # otherwise the per-node config's watch follows the Node
                from nvdp.kube import NodeWatcher

                self.watcher = NodeWatcher(self.skeleton.api.client(), self.opts.node_name,
                                           lambda n: self.on_labels(n.labels))
                self.watcher.start()
        node_config = self.skeleton.node_config
        self.discovery = Discovery(self.opts, config, output,
                                   first_labels=self.labels_seen if self._node_outputs else None,
                                   report=node_config.report if node_config is not None else None)
        log.info("Running with config from %s (migStrategy %s, sleepInterval %s, output %s)",
                 config.source, config.flags.mig_strategy, config.flags.gfd.sleep_interval,
                 type(output).__name__)
        return self.discovery.step()

    def start_failed(self, err: Exception) -> int | None:
        from nvdp.config.select import SelectionError
        from nvdp.daemon.pernode.nodechoice import ConfigRefused
        from nvdp.inventory.nvml import NvmlUnavailable

        if isinstance(err, (ConfigRefused, SelectionError)):
            log.error("invalid configuration:\n%s", err)
        elif isinstance(err, (StartupError, NvmlUnavailable)):
            log.error("%s", err)
        else:
            raise err
        return EXIT_FAILED

    def step(self, wakes: Wakes) -> int | None:
        from nvdp.inventory.nvml import NvmlUnavailable

        assert self.discovery is not None
        try:
            return self.discovery.step(wakes)
        except NvmlUnavailable as e:
            log.error("%s", e)
            return EXIT_FAILED

    def wake_after(self) -> float | None:
        return self.discovery.timeout() if self.discovery is not None else None

    def stop(self) -> None:
        if self.discovery is not None and self.output is not None:
            keep = self.discovery.config.flags.gfd.oneshot or math.isinf(self.discovery.interval_s)
            self.output.close(keep)
        if self.watcher is not None:
            self.watcher.stop()
