"""`nvidia-device-plugin`: advertise a node's NVIDIA GPUs to the kubelet.

Exit status: 0 after SIGTERM/SIGINT/SIGQUIT; 1 when the plugin cannot start (invalid config, NVML
missing with failOnInitError, a config that cannot be applied to this node's GPUs, CDI specs that
cannot be made or written), with the cause and the fix in the log; 2 for command-line usage errors.

SIGHUP, and with --config-dir a change of this node's entry (nvdp.daemon.pernode.nodechoice), reloads the
config,
re-reads the GPUs and re-plans: unchanged resources keep their servers, an invalid config is reported
and the previous one stays. GPUs that are down stay down across a re-plan, and across a restart when
the config names a healthStateDir (nvdp.health); each comes back by the health rules.

In DRA mode (nvdp.daemon.pernode.mode: the entry's flags.mode, else NVDP_DEFAULT_MODE) the plugin serves
nothing: its
servers stop, so the kubelet marks the resources unhealthy. Entering device-plugin mode beside a DRA
plugin (DRA_DRIVER_NAME set), it advertises only once the DRA plugin's ResourceSlices for the node
are gone; a switch while GPU pods run waits for them (ModeSwitchRefused).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from nvdp import __version__

NAME = "nvidia-device-plugin"


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    from nvdp.config.flags import ENV_RULE, ScreenHelp, add_config_arguments
    from nvdp.daemon.pernode.nodeconfig import add_node_config_arguments
    from nvdp.daemon.report import observe
    from nvdp.usage import add_arguments as add_usage_arguments

    parser = argparse.ArgumentParser(
        formatter_class=ScreenHelp,
        prog=NAME,
        description="Advertise this node's NVIDIA GPUs to the kubelet (device-plugin API v1beta1). "
                    f"{ENV_RULE}",
    )
    parser.add_argument("--version", action="version", version=f"{NAME} {__version__}")
    add_config_arguments(parser)
    observe.add_arguments(parser, os.environ if env is None else env)
    add_usage_arguments(parser, os.environ if env is None else env)
    add_node_config_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from nvdp.daemon.pernode.nodeconfig import settings_from
    from nvdp.daemon.report import observe
    from nvdp.daemon.report.logs import setup_logging
    from nvdp.daemon.skeleton import Events, Skeleton
    from nvdp.plugin import observe as endpoints
    from nvdp.plugin.state import ServingView
    from nvdp.plugin.work import DevicePluginWork

    parser = build_parser()
    args = parser.parse_args(argv)
    observe.check_addresses(parser, args)
    log = setup_logging(NAME)
    log.info("Starting NVIDIA device plugin (nvdp %s)", __version__)
    skeleton = Skeleton(NAME, log, os.environ, kubeconfig=args.kubeconfig)
    work = DevicePluginWork(skeleton, args)
    return skeleton.run(work, settings=settings_from(args, os.environ), config_file=args.config_file,
                        events=Events(),
                        serve=lambda: endpoints.start(ServingView(work), args, log, skeleton.recorder),
                        serve_fix=observe.PORT_FIX)


if __name__ == "__main__":
    sys.exit(main())
