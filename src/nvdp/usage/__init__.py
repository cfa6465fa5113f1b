"""Who uses which GPU: each container's GPU memory and SM utilization on the node's shared GPUs.

One collection (`nvdp.usage.collect.UsageCollector.collect`) joins four node-local answers:

- NVML: the processes on each GPU and MIG device, with their memory and SM utilization
  (nvdp.inventory.processes);
- /proc/<pid>/cgroup and /proc/<pid>/mountinfo: the pod UID, container ID and container name of each
  process (`procfs`; the host's PIDs, hence hostPID in the chart);
- the kubelet's pod-resources API: which container holds which device-plugin device or claim
  (nvdp.daemon.podresources);
- which pod UID each holder is: the kubelet's device checkpoint for device-plugin devices (beside the
  plugin's sockets), a claim's `status.reservedFor` for claims (the DRA plugin's API client).

`attribute` (plain) turns them into one `Use` per container and device; the daemons serve them as
Prometheus series (`series`), `nvdp usage` prints them. Each plugin counts only what it handed out:
the device plugin its devices, the DRA plugin its driver's claims, so a node running both never
counts a pod twice.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

USAGE_METRICS_ENV = "USAGE_METRICS"


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """The daemons' switch: --usage-metrics (env USAGE_METRICS=true)."""
    parser.add_argument(
        "--usage-metrics", action="store_true",
        default=env.get(USAGE_METRICS_ENV, "").strip().lower() in ("1", "true", "yes"),
        help="with --metrics-address, serve each container's GPU memory and SM utilization on the "
        "GPUs this plugin handed out (needs hostPID to see other pods' processes)",
    )
