"""A daemon's inputs: its config from flags, env and the chosen entry, and its GPUs from NVML.

The first stages of the data flow, the same for the device plugin and the DRA plugin; each raises
with the cause and the fix (StartupError, NvmlMissing) and changes nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from nvdp.config.model import Config
from nvdp.daemon.errors import NvmlMissing, StartupError
from nvdp.inventory.model import Inventory


def load_config(args: argparse.Namespace, env: Mapping[str, str], entry: Path | None,
                per_node: bool) -> Config:
    """The config from flags, env and a file: `entry` in per-node mode (never CONFIG_FILE), else
    CONFIG_FILE."""
    from nvdp.config.flags import overrides_from_args
    from nvdp.config.loader import ConfigError, entry_in_force
    from nvdp.config.loader import load_config as load

    path, env = entry_in_force(args.config_file, env, entry, per_node=per_node)
    try:
        return load(path, env, overrides_from_args(args))
    except ConfigError as err:
        raise StartupError(str(err)) from None


def discover(config: Config) -> Inventory:
    """The node's GPUs; NvmlMissing (with `fail` from failOnInitError) when NVML cannot be read."""
    from nvdp.inventory.nvml import NvmlUnavailable
    from nvdp.inventory.nvml import discover as read_gpus

    try:
        return read_gpus(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)
    except NvmlUnavailable as err:
        missing = NvmlMissing(str(err))
        missing.fail = config.flags.fail_on_init_error
        raise missing from None
