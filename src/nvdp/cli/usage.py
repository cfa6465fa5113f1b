"""`nvdp usage`: per GPU, the pods using it, with their GPU memory and SM utilization.

Run in a plugin's pod (`kubectl exec`), where the kubelet's sockets are mounted and the host's
processes are visible (the chart's `metrics.usage.enabled`). It collects as the plugins' usage series
do, with the same function (nvdp.usage.collect): the device plugin's devices from the kubelet's device
checkpoint, and the DRA driver's claims with their pods read from the API server.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from nvdp.config.model import DEFAULT_DEVICE_PLUGIN_DIR
from nvdp.config.names import DRA_DRIVER_ENV
from nvdp.config.sources import ENV_VARS
from nvdp.usage.holders import CHECKPOINT_FILE
from nvdp.usage.model import DeviceInfo, Usage, Use

# The variable the chart sets to the kubelet's device-plugins folder (the config's devicePluginPath).
DEVICE_PLUGIN_PATH_ENV = next(env for env, path in ENV_VARS.items()
                              if path == "flags.plugin.devicePluginPath")


def register(subparsers: Any) -> None:
    from nvdp.daemon.podresources import POD_RESOURCES_ENV, POD_RESOURCES_SOCKET
    from nvdp.daemon.preview import add_output_option
    from nvdp.dra.pool.names import DEFAULT_DRIVER

    env = os.environ
    parser = subparsers.add_parser(
        "usage", help="show the pods on each GPU with their GPU memory and SM utilization",
        description="Show, per GPU of this node, the pods (and containers, and claims in DRA mode) that "
                    "hold it, with the GPU memory their processes use and their SM utilization, as the "
                    "plugins' usage series report them. Run it in a plugin's pod with the chart's "
                    "metrics.usage.enabled (the host's PID namespace).")
    add_output_option(parser)
    parser.add_argument("--pod-resources-socket", metavar="PATH",
                        default=env.get(POD_RESOURCES_ENV, "").strip() or POD_RESOURCES_SOCKET,
                        help=f"the kubelet's pod-resources socket (env {POD_RESOURCES_ENV}; "
                             "default %(default)s)")
    parser.add_argument("--kubelet-checkpoint", metavar="PATH", default=_checkpoint(env),
                        help="the kubelet's device checkpoint: who holds the device plugin's devices "
                             "(default: kubelet_internal_checkpoint in $DEVICE_PLUGIN_PATH, else "
                             "/var/lib/kubelet/device-plugins)")
    parser.add_argument("--driver", metavar="NAME", default=env.get(DRA_DRIVER_ENV) or DEFAULT_DRIVER,
                        help=f"the DRA driver whose claims count (env {DRA_DRIVER_ENV}; default %(default)s)")
    parser.add_argument("--proc-root", metavar="DIR", default="/proc", help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def _checkpoint(env: Mapping[str, str]) -> str:
    folder = env.get(DEVICE_PLUGIN_PATH_ENV, "").strip() or DEFAULT_DEVICE_PLUGIN_DIR
    return os.path.join(folder, CHECKPOINT_FILE)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the usage; problems (a source that could not be read) go to `err`, exit status 1."""
    out = out or sys.stdout
    err = err or sys.stderr
    usage = collector(args, os.environ).collect()
    if args.output == "table":
        out.write(table(usage))
    else:
        from nvdp.daemon.preview import print_document

        print_document(document(usage), args.output, out)
    for problem in usage.problems:
        print(f"nvdp usage: {problem}", file=err)
    return 1 if usage.problems else 0


def collector(args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """The daemons' collector, counting both the device plugin's devices and the driver's claims."""
    from nvdp.daemon.preview import this_node
    from nvdp.dra.pool.names import device_uuids
    from nvdp.usage.collect import DraCounting, UsageCollector, UsageSource

    client: list[Any] = []

    def read_claim(namespace: str, name: str) -> Mapping[str, Any] | None:
        from nvdp.kube import connect, get_claim

        if not client:
            client.append(connect(None))
        return get_claim(client[0], namespace, name)

    checkpoint = args.kubelet_checkpoint
    source = UsageSource(node=this_node(env), pod_resources_socket=args.pod_resources_socket,
                         proc_root=args.proc_root)
    return UsageCollector(source, checkpoint=lambda: checkpoint if os.path.exists(checkpoint) else None,
                          dra=DraCounting(args.driver, device_uuids, read_claim))


def document(usage: Usage) -> dict[str, Any]:
    """Per device with a holder or a process, in the node's order: its pods and other processes."""
    devices: dict[str, dict[str, Any]] = {}
    for use in usage.uses:
        _device_entry(devices, use.device)["pods"].append(_pod_entry(use))
    for device, count in usage.others:
        _device_entry(devices, device)["otherProcesses"] = count
    return {"node": usage.node, "devices": list(devices.values()), "problems": list(usage.problems)}


def _device_entry(devices: dict[str, dict[str, Any]], device: DeviceInfo) -> dict[str, Any]:
    if device.uuid not in devices:
        mig = (None if device.mig_gi_id is None
               else {"profile": device.mig_profile, "gpuInstance": device.mig_gi_id})
        devices[device.uuid] = {"gpu": device.gpu_index, "uuid": device.uuid, "gpuUUID": device.gpu_uuid,
                                "model": device.model, "device": f"nvidia{device.minor}", "mig": mig,
                                "pods": [], "otherProcesses": 0}
    return devices[device.uuid]


def _pod_entry(use: Use) -> dict[str, Any]:
    h = use.holder
    claim = None if not h.claim_name else {"namespace": h.claim_namespace, "name": h.claim_name,
                                            "driver": h.driver, "pool": h.pool, "device": h.device_name}
    return {"namespace": h.namespace, "pod": h.pod, "container": h.container, "podUID": h.pod_uid,
            "resource": h.resource or None, "claim": claim, "memoryBytes": use.memory_bytes,
            "smUtilization": use.sm_util, "processes": use.processes}


def table(usage: Usage) -> str:
    from nvdp.text import columns

    if not usage.uses and not usage.others:
        return "No pod holds a GPU this node's plugins handed out.\n" if not usage.problems else ""
    rows = []
    for entry in document(usage)["devices"]:
        where = f"{entry['gpu']}" + (f" {entry['mig']['profile']}" if entry["mig"] else "")
        for pod in entry["pods"]:
            claim = pod["claim"]
            rows.append((where, entry["uuid"], pod["namespace"], pod["pod"], pod["container"],
                         f"{claim['namespace']}/{claim['name']}" if claim else "-",
                         _bytes(pod["memoryBytes"]),
                         "-" if pod["smUtilization"] is None else f"{pod['smUtilization']}%",
                         str(pod["processes"])))
        if entry["otherProcesses"]:
            rows.append((where, entry["uuid"], "(no holder)", "-", "-", "-", "-", "-",
                         str(entry["otherProcesses"])))
    header = ("GPU", "DEVICE", "NAMESPACE", "POD", "CONTAINER", "CLAIM", "MEMORY", "SM", "PROCESSES")
    return "\n".join(columns(header, rows)) + "\n"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
