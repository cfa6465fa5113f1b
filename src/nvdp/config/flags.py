"""NVIDIA's device-plugin command-line flags, mapped onto config paths.

Values stay text here; the loader converts and validates them exactly like environment values,
so a bad flag is reported as a ConfigError naming the flag.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nvdp.config.sources import FLAG_PATHS

if TYPE_CHECKING:
    from argparse import _ActionsContainer

# Main flag name -> aliases NVIDIA also accepts.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "--driver-root": ("--nvidia-driver-root",),
    "--dev-root": ("--nvidia-dev-root",),
    "--nvidia-cdi-hook-path": ("--nvidia-ctk-path",),
    "--driver-root-ctr-path": ("--container-driver-root",),
}
BOOL_FLAGS = frozenset(
    {
        "--fail-on-init-error",
        "--pass-device-specs",
        "--gds-enabled",
        "--mofed-enabled",
        "--gdrcopy-enabled",
        "--imex-required",
    }
)
_HELP = {
    "--mig-strategy": "none, single or mixed (env MIG_STRATEGY)",
    "--mig-dynamic-profiles": "migStrategy dynamic: comma list of the MIG profiles (1g.10gb) or placements "
    "(3g.40gb@4) a node publishes; default every profile (env MIG_DYNAMIC_PROFILES)",
    "--fail-on-init-error": "exit when NVML cannot be initialised (env FAIL_ON_INIT_ERROR)",
    "--mps-root": "host directory shared with the MPS control daemon (env MPS_ROOT)",
    "--driver-root": "host path of the NVIDIA driver (env NVIDIA_DRIVER_ROOT)",
    "--dev-root": "host path of /dev/nvidia* (env NVIDIA_DEV_ROOT)",
    "--gdrcopy-enabled": "give containers GDRCopy (env GDRCOPY_ENABLED)",
    "--gds-enabled": "give containers GPUDirect Storage (env GDS_ENABLED)",
    "--mofed-enabled": "give containers MOFED (env MOFED_ENABLED)",
    "--device-discovery-strategy": "auto or nvml; tegra is refused (env DEVICE_DISCOVERY_STRATEGY)",
    "--pass-device-specs": "also return device nodes in Allocate (env PASS_DEVICE_SPECS)",
    "--device-list-strategy": "comma list of envvar, volume-mounts, cdi-annotations, cdi-cri "
    "(env DEVICE_LIST_STRATEGY)",
    "--device-id-strategy": "uuid or index (env DEVICE_ID_STRATEGY)",
    "--cdi-annotation-prefix": "prefix of CDI annotations (env CDI_ANNOTATION_PREFIX)",
    "--nvidia-cdi-hook-path": "host path of nvidia-ctk or nvidia-cdi-hook, written into CDI specs "
    "(env NVIDIA_CDI_HOOK_PATH)",
    "--cdi-feature-flags": "comma list of CDI feature flags: no-additional-gids-for-device-nodes, "
    "disable-ipc-discoverer, enable-explicit-driver-libraries (env CDI_FEATURE_FLAGS)",
    "--cdi-disable-hooks": "comma list of CDI hooks to leave out, or all (env CDI_DISABLE_HOOKS)",
    "--driver-root-ctr-path": "driver root inside this container (env DRIVER_ROOT_CTR_PATH)",
    "--shared-devices-allocation-policy": "distributed or packed (env SHARED_DEVICES_ALLOCATION_POLICY)",
    "--device-plugin-path": "kubelet device-plugin directory (env DEVICE_PLUGIN_PATH)",
    "--kubelet-socket": "kubelet registration socket (env KUBELET_SOCKET)",
    "--health-recovery-after": "quiet time after the last critical XID before an Unhealthy GPU is checked "
    "again, e.g. 30s, 5m, 1h30m, or never (env HEALTH_RECOVERY_AFTER)",
    "--health-flap-limit": "a GPU that turns Unhealthy more than this many times in an hour stays down "
    "(env HEALTH_FLAP_LIMIT)",
    "--health-state-dir": "host directory for health.json; empty: no file (env HEALTH_STATE_DIR)",
    "--health-taint-effect": "DRA mode: NoSchedule or NoExecute, the effect of a down GPU's device taints "
    "(env HEALTH_TAINT_EFFECT)",
    "--imex-channel-ids": "comma list of IMEX channels: empty or 0 (env IMEX_CHANNEL_IDS)",
    "--imex-required": "fail when an IMEX channel is missing (env IMEX_REQUIRED)",
}


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --config-file and every flag that sets a config value.

    Flags not given leave no attribute (so they do not override the environment or the file);
    boolean flags accept `--flag` (true) and `--flag=true|false|1|0|yes|no`.
    """
    group = parser.add_argument_group("configuration (flag > environment > config file > default)")
    group.add_argument(
        "--config-file", dest="config_file", metavar="PATH", help="config file (env CONFIG_FILE)"
    )
    for flag in FLAG_PATHS:
        add_config_flag(group, flag)


def add_config_flag(group: _ActionsContainer, flag: str, *, first: str | None = None,
                    help_text: str | None = None, metavar: str = "VALUE") -> None:
    """One config flag as the plugin takes it (its aliases, its destination, read by
    `overrides_from_args`), for a command that takes some of the plugin's settings; `first` puts one
    of its names first in the help."""
    names = [flag, *FLAG_ALIASES.get(flag, ())]
    if first is not None:
        names.remove(first)
        names.insert(0, first)
    if flag in BOOL_FLAGS:
        group.add_argument(
            *names,
            dest=_dest(flag),
            nargs="?",
            const="true",
            default=argparse.SUPPRESS,
            metavar="BOOL",
            help=help_text or _HELP[flag],
        )
    else:
        group.add_argument(
            *names, dest=_dest(flag), default=argparse.SUPPRESS, metavar=metavar,
            help=help_text or _HELP[flag],
        )


def overrides_from_args(ns: argparse.Namespace) -> dict[str, object]:
    """Config path -> value, for the flags actually given on the command line."""
    given = vars(ns)
    return {path: given[_dest(flag)] for flag, path in FLAG_PATHS.items() if _dest(flag) in given}
