"""`nvidia-dra-plugin`: this node's GPUs as `resource.k8s.io/v1` devices, claims prepared through CDI.

The DRA kubelet plugin, on the run loop and per-node config rule every nvdp daemon shares. It reads
the same config, GPUs and CDI driver facts as the device plugin, publishes this node's pool as
ResourceSlices (written only when the devices or their health change), registers with the kubelet
through its plugin watcher, and answers NodePrepareResources / NodeUnprepareResources from the claims'
allocations, one CDI spec per claim, with a checkpoint of what it prepared.

Exit status: 0 after SIGTERM/SIGINT/SIGQUIT; 1 when it cannot start (invalid config, no GPUs' NVML, CDI
facts that cannot be read, no API server access, a driver name the kubelet would refuse), with the cause
and the fix in the log; 2 for command-line usage errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nvdp import __version__
from nvdp.config.names import DRA_DRIVER_ENV, node_name
from nvdp.daemon.podresources import POD_RESOURCES_ENV
from nvdp.daemon.runloop import EXIT_USAGE
from nvdp.daemon.skeleton import Events, Skeleton
from nvdp.dra.pool.names import DEFAULT_DRIVER, check_driver_name

if TYPE_CHECKING:
    from nvdp.dra.work import DraWork
    from nvdp.usage.collect import UsageCollector

NAME = "nvidia-dra-plugin"
DRIVER_ENV = DRA_DRIVER_ENV
PLUGINS_DIR_ENV = "KUBELET_PLUGINS_DIR"
REGISTRAR_DIR_ENV = "KUBELET_REGISTRAR_DIR"
# The pod's UID (the chart sets it from metadata.uid): sockets of their own, for a rolling update.
INSTANCE_ENV = "POD_UID"
CDI_ROOT_ENV = "CDI_ROOT"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_ROOT = "/var/run/cdi"


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    from nvdp.config.flags import ENV_RULE, ScreenHelp, add_config_arguments
    from nvdp.daemon.pernode.nodeconfig import add_node_config_arguments
    from nvdp.daemon.podresources import POD_RESOURCES_SOCKET
    from nvdp.daemon.report import observe
    from nvdp.usage import add_arguments as add_usage_arguments

    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        formatter_class=ScreenHelp,
        prog=NAME,
        description="Publish this node's NVIDIA GPUs as resource.k8s.io/v1 devices and prepare the "
                    f"ResourceClaims allocated to them (a kubelet DRA plugin). {ENV_RULE}",
    )
    parser.add_argument("--version", action="version", version=f"{NAME} {__version__}")
    observe.add_arguments(parser, env)
    add_usage_arguments(parser, env)
    add_node_config_arguments(parser)
    group = parser.add_argument_group("DRA")
    group.add_argument("--driver-name", default=env.get(DRIVER_ENV) or DEFAULT_DRIVER, metavar="NAME",
                       help=f"the DRA driver name (env {DRIVER_ENV}; default %(default)s)")
    group.add_argument("--kubelet-plugins-dir", default=env.get(PLUGINS_DIR_ENV) or DEFAULT_PLUGINS_DIR,
                       metavar="DIR", help="the kubelet's plugins folder (default %(default)s)")
    group.add_argument("--kubelet-registrar-dir",
                       default=env.get(REGISTRAR_DIR_ENV) or DEFAULT_REGISTRAR_DIR, metavar="DIR",
                       help="the kubelet's plugin registration folder (default %(default)s)")
    group.add_argument("--kubelet-pod-resources-socket",
                       default=env.get(POD_RESOURCES_ENV) or POD_RESOURCES_SOCKET, metavar="PATH",
                       help="the kubelet's pod-resources socket: which containers hold which claims "
                            "(default %(default)s)")
    group.add_argument("--instance", default=env.get(INSTANCE_ENV) or "", metavar="UID",
                       help="name the kubelet sockets after UID (dra-UID.sock), so that a new pod serves "
                            f"beside the old one in a rolling update (env {INSTANCE_ENV}, the pod's UID); "
                            "empty: dra.sock")
    group.add_argument("--cdi-root", default=env.get(CDI_ROOT_ENV) or DEFAULT_CDI_ROOT, metavar="DIR",
                       help="where the per-claim CDI specs go (default %(default)s)")
    add_config_arguments(parser, listed=False)
    return parser


def check_start(driver: str, node: str, instance: str = "") -> str | None:
    """Why the plugin cannot start with these settings (a usage error); None when it may."""
    problem = check_driver_name(driver)
    if problem is not None:
        return f"--driver-name / {DRIVER_ENV}: {problem}"
    if instance and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}", instance):
        return (f"--instance / {INSTANCE_ENV}: {instance!r} is not a pod UID (letters, digits and '-', up to "
                "63): it names this instance's sockets; set it from the pod's metadata.uid (the chart does) "
                "or leave it empty")
    if not node:
        return ("NODE_NAME is not set: the DRA plugin publishes this node's pool under its name; set it "
                "from the pod's spec.nodeName (the chart does)")
    return None


def run(args: argparse.Namespace, env: Mapping[str, str], log: logging.Logger) -> int:
    from nvdp.daemon.pernode.nodeconfig import settings_from
    from nvdp.daemon.report.observe import PORT_FIX
    from nvdp.dra.probes import serve_probes
    from nvdp.dra.work import DraWork

    problem = check_start(args.driver_name, node_name(env), args.instance)
    if problem is not None:
        log.error("%s", problem)
        return EXIT_USAGE
    skeleton = Skeleton(NAME, log, env, kubeconfig=args.kubeconfig)
    work = DraWork(skeleton, args)
    return skeleton.run(work, settings=settings_from(args, env), config_file=args.config_file,
                        events=Events(), serve=lambda: serve_probes(work, args, log, usage_of(work, args)),
                        serve_fix=PORT_FIX)


def usage_of(work: DraWork, args: argparse.Namespace) -> UsageCollector | None:
    """With --usage-metrics: the usage of this driver's claims (nvdp.usage), their pods read from the
    claims' status through the plugin's API client."""
    if not (args.metrics_address and args.usage_metrics):
        return None
    from nvdp.dra.pool.names import device_uuids
    from nvdp.kube import get_claim
    from nvdp.usage.collect import DraCounting, UsageCollector, UsageSource

    def read_claim(namespace: str, name: str) -> Mapping[str, Any] | None:
        return get_claim(work.skeleton.api.client(), namespace, name)

    source = UsageSource(node=work.node, pod_resources_socket=args.kubelet_pod_resources_socket)
    return UsageCollector(source, dra=DraCounting(work.driver, device_uuids, read_claim), log=work.log)


def main(argv: Sequence[str] | None = None) -> int:
    from nvdp.daemon.report import observe
    from nvdp.daemon.report.logs import setup_logging

    parser = build_parser()
    args = parser.parse_args(argv)
    observe.check_addresses(parser, args)
    log = setup_logging(NAME)
    log.info("Starting NVIDIA DRA kubelet plugin (nvdp %s), driver %s", __version__, args.driver_name)
    return run(args, os.environ, log)


if __name__ == "__main__":
    sys.exit(main())
