"""`gpu-feature-discovery --presence-only`: mark nodes with NVIDIA GPUs on the PCI bus, then idle.

For clusters without node-feature-discovery: the chart's default affinity accepts
`nvidia.com/gpu.present=true`, so this lets the plugin (and the full labeller) land on GPU nodes.
It reads sysfs only (no NVML, no driver), sets the label when it is missing, never removes it (the
GPU operator and people set it too), and then replaces itself with a bare interpreter that waits for
SIGTERM: a few MiB per node instead of a Python process with an API client.
"""

from __future__ import annotations

import logging
import os
import sys

from nvdp.gfd.host import nvidia_gpus_present
from nvdp.gfd.labels import GPU_PRESENT
from nvdp.gfd.options import ProcessOptions

log = logging.getLogger("nvdp.gfd")

IDLE_PROGRAM = (
    "import signal,sys\n"
    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT): signal.signal(s, lambda *a: sys.exit(0))\n"
    "while True: signal.pause()\n"
)


def mark_present(opts: ProcessOptions) -> bool:
    """Label the node when it has an NVIDIA GPU; True when it has one."""
    found = nvidia_gpus_present(opts.sysfs_root)
    if not found:
        log.info("no NVIDIA GPU on the PCI bus (%s/bus/pci/devices): nothing to label", opts.sysfs_root)
        return False
    log.info("NVIDIA GPU(s) on the PCI bus: %s", ", ".join(found))
    if not opts.node_name:
        raise RuntimeError(
            "no node name: set NODE_NAME (the chart sets it from spec.nodeName) or --node-name"
        )
    from nvdp.kube import connect, get_node_labels, patch_node_labels

    client = connect(opts.kubeconfig)
    try:
        labels = get_node_labels(client, opts.node_name).labels
        if labels.get(GPU_PRESENT) == "true":
            log.info("node %s already has %s=true", opts.node_name, GPU_PRESENT)
        else:
            patch_node_labels(client, opts.node_name, {GPU_PRESENT: "true"})
            log.info("labelled node %s %s=true", opts.node_name, GPU_PRESENT)
    finally:
        client.close()
    return True


def idle() -> None:
    """Replace this process with the smallest waiting one the image has."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-S", "-E", "-c", IDLE_PROGRAM])


def run_presence(opts: ProcessOptions, *, stay: bool = True) -> int:
    try:
        mark_present(opts)
    except Exception as e:  # the API or sysfs failed: exit so the kubelet retries with back-off
        log.error("presence check failed: %s", e)
        return 1
    if stay:
        idle()
    return 0
