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

import os
import sys
from collections.abc import Mapping, Sequence

from nvdp.config.select import SelectionError
from nvdp.daemon.report.logs import setup_logging
from nvdp.daemon.runloop import EXIT_USAGE
from nvdp.daemon.skeleton import Events, Skeleton
from nvdp.gfd.discovery import log
from nvdp.gfd.options import ProcessOptions, parse_options
from nvdp.gfd.work import GfdWork

NAME = "gpu-feature-discovery"


def run(opts: ProcessOptions, env: Mapping[str, str]) -> int:
    skeleton = Skeleton(NAME, log, env, kubeconfig=opts.kubeconfig, guard=False)
    work = GfdWork(skeleton, opts, env)
    # With per-node config, its problems are Events on the Node; without, the labeller records none.
    events = Events(opts.node_name, opts.kubeconfig) if opts.node_config is not None else None
    return skeleton.run(work, settings=opts.node_config, events=events, on_labels=work.on_labels)


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging(log.name, keep_handlers=True)
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
