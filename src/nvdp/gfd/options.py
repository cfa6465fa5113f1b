"""gpu-feature-discovery's command line and environment, with NVIDIA's names.

Settings that live in the config file (`flags.gfd.*`, `flags.migStrategy`, ...) go through the same
loader as the plugin's, so a bad value is reported with its source; precedence is flag >
`GFD_*` variable > plain variable > config file > default. Process settings (node name, namespace,
kubeconfig) are plain options.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from msgspec import Struct

from nvdp.config import names
from nvdp.config.durations import parse_duration as parse_duration  # where GFD's callers import it
from nvdp.config.sources import CONFIG_FILE_ENV, ENV_VARS
from nvdp.daemon.pernode.nodeconfig import NodeConfigSettings, add_node_config_arguments, settings_from

# GFD's names first: when two names lead to one path, the first one set wins.
GFD_ENV_VARS: Mapping[str, str] = {
    "GFD_MIG_STRATEGY": "flags.migStrategy",
    "GFD_FAIL_ON_INIT_ERROR": "flags.failOnInitError",
    "GFD_ONESHOT": "flags.gfd.oneshot",
    "GFD_NO_TIMESTAMP": "flags.gfd.noTimestamp",
    "GFD_SLEEP_INTERVAL": "flags.gfd.sleepInterval",
    "GFD_OUTPUT_FILE": "flags.gfd.outputFile",
    "GFD_MACHINE_TYPE_FILE": "flags.gfd.machineTypeFile",
    "GFD_USE_NODE_FEATURE_API": "flags.useNodeFeatureAPI",
    "USE_NODE_FEATURE_API": "flags.useNodeFeatureAPI",
    # The plugin's names too, HEALTH_STATE_DIR among them: GFD reads the health authority's health.json.
    **{name: path for name, path in ENV_VARS.items() if path},
}
CONFIG_FILE_ENVS = ("GFD_CONFIG_FILE", CONFIG_FILE_ENV)

# Flag -> config path; the flag's own text goes through the loader's conversion and validation.
GFD_FLAG_PATHS: Mapping[str, str] = {
    "--mig-strategy": "flags.migStrategy",
    "--fail-on-init-error": "flags.failOnInitError",
    "--oneshot": "flags.gfd.oneshot",
    "--no-timestamp": "flags.gfd.noTimestamp",
    "--sleep-interval": "flags.gfd.sleepInterval",
    "--output-file": "flags.gfd.outputFile",
    "--machine-type-file": "flags.gfd.machineTypeFile",
    "--use-node-feature-api": "flags.useNodeFeatureAPI",
    "--device-discovery-strategy": "flags.deviceDiscoveryStrategy",
    "--driver-root": "flags.nvidiaDriverRoot",
    "--driver-root-ctr-path": "flags.plugin.containerDriverRoot",
    "--health-state-dir": "flags.plugin.healthStateDir",
}
_BOOL = {"--fail-on-init-error", "--oneshot", "--no-timestamp", "--use-node-feature-api"}
_ALIASES = {"--output-file": ("-o", "--output"), "--driver-root": ("--nvidia-driver-root",),
            "--driver-root-ctr-path": ("--container-driver-root",)}  # fmt: skip
_HELP = {
    "--mig-strategy": "none, single, mixed or dynamic (env GFD_MIG_STRATEGY, MIG_STRATEGY)",
    "--fail-on-init-error": "exit when NVML cannot be used, else keep retrying (env GFD_FAIL_ON_INIT_ERROR)",
    "--oneshot": "label once and exit (env GFD_ONESHOT)",
    "--no-timestamp": "leave out nvidia.com/gfd.timestamp (env GFD_NO_TIMESTAMP)",
    "--sleep-interval": "time between NVML re-checks, e.g. 60s, 5m or infinite (env GFD_SLEEP_INTERVAL)",
    "--output-file": "features.d file written when useNodeFeatureAPI is false; empty: standard output "
    "(env GFD_OUTPUT_FILE)",
    "--machine-type-file": "file holding the machine type (env GFD_MACHINE_TYPE_FILE)",
    "--use-node-feature-api": "true: publish through an NFD NodeFeature object; false: write the "
    "features.d file; unset: label the Node directly (env GFD_USE_NODE_FEATURE_API)",
    "--device-discovery-strategy": "auto or nvml (env DEVICE_DISCOVERY_STRATEGY)",
    "--driver-root": "host path of the NVIDIA driver (env NVIDIA_DRIVER_ROOT)",
    "--driver-root-ctr-path": "driver root inside this container (env DRIVER_ROOT_CTR_PATH)",
    "--health-state-dir": "host directory of health.json, written by the device plugin or the DRA plugin "
    "(env HEALTH_STATE_DIR)",
}


class ProcessOptions(Struct, frozen=True):
    """Settings of the process itself, outside the config file."""

    config_file: str | None
    node_name: str
    namespace: str
    pod_name: str
    kubeconfig: str | None
    sysfs_root: str
    presence_only: bool
    overrides: Mapping[str, object]
    # Per-node config (CONFIG_DIR): the entry is chosen by the node's label, as the plugin does.
    node_config: NodeConfigSettings | None = None


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def parser() -> argparse.ArgumentParser:
    from nvdp.config.flags import ENV_RULE, ScreenHelp

    p = argparse.ArgumentParser(
        formatter_class=ScreenHelp,
        prog="gpu-feature-discovery",
        description="Label this node with its GPUs' features (NVIDIA's gpu-feature-discovery labels). "
                    f"{ENV_RULE}",
    )
    p.add_argument("--config-file", help="config file (env GFD_CONFIG_FILE, CONFIG_FILE)")
    for flag, _path in GFD_FLAG_PATHS.items():
        names = (flag, *_ALIASES.get(flag, ()))
        if flag in _BOOL:
            p.add_argument(*names, dest=_dest(flag), nargs="?", const="true", default=argparse.SUPPRESS,
                           metavar="BOOL", help=_HELP[flag])  # fmt: skip
        else:
            p.add_argument(
                *names, dest=_dest(flag), default=argparse.SUPPRESS, metavar="VALUE", help=_HELP[flag]
            )
    p.add_argument(
        "--namespace", help="namespace of the NodeFeature object (env NAMESPACE, default: default)"
    )
    p.add_argument("--pod-name", help="this pod's name, for the NodeFeature owner (env POD_NAME)")
    add_node_config_arguments(p)  # --config-dir, --default-config, --node-name, --kubeconfig, ...
    p.add_argument("--sysfs-root", help="where sysfs is mounted (env GFD_SYSFS_ROOT, default /sys)")
    p.add_argument(
        "--presence-only",
        nargs="?",
        const="true",
        metavar="BOOL",
        help="only check for NVIDIA GPUs on the PCI bus (no NVML, no driver) and label the node "
        "nvidia.com/gpu.present=true, then idle (env GFD_PRESENCE_ONLY)",
    )
    return p


def parse_options(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> ProcessOptions:
    env = os.environ if env is None else env
    ns = parser().parse_args(argv)
    given = vars(ns)
    overrides = {path: given[_dest(flag)] for flag, path in GFD_FLAG_PATHS.items() if _dest(flag) in given}
    config_file = ns.config_file or next((env[n] for n in CONFIG_FILE_ENVS if env.get(n)), None)
    presence = ns.presence_only if ns.presence_only is not None else env.get("GFD_PRESENCE_ONLY", "false")
    return ProcessOptions(
        config_file=config_file,
        node_name=names.node_name(env, ns.node_name),
        namespace=ns.namespace or env.get("NAMESPACE", "") or "default",
        pod_name=ns.pod_name or env.get("POD_NAME", ""),
        kubeconfig=ns.kubeconfig or None,
        sysfs_root=ns.sysfs_root or env.get("GFD_SYSFS_ROOT", "") or "/sys",
        presence_only=presence.strip().lower() in ("true", "1", "yes"),
        overrides=overrides,
        node_config=settings_from(ns, env),
    )
