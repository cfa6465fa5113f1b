"""IMEX channels: which of `imex.channelIDs` exist on this node, checked when the plugin prepares.

As NVIDIA v0.20.0 (internal/imex/imex.go, called from cmd/nvidia-device-plugin/plugin-manager.go):
channel N is the device node /dev/nvidia-caps-imex-channels/channel<N>. It is looked for under the
dev root the plugin sees (the container driver root when it has a /dev folder, else /) and then at
the plain path, and counts only as a character device. A missing channel stops the plugin when
`imex.required` is set; otherwise it is left out with a warning. Only the channels found are handed
out: NVIDIA_IMEX_CHANNELS, the volume mounts, the CDI names and the device specs all come from the
config this returns, so a container never gets a channel the node does not have.

`check_channels` is pure (the filesystem comes in as two functions); `channels_on_node` is the edge
that stats the node, logs NVIDIA's lines and raises StartupError.
"""

from __future__ import annotations

import logging
import os
import posixpath
import stat
from collections.abc import Callable

from msgspec import Struct
from msgspec.structs import replace

from nvdp.config.model import Config
from nvdp.daemon.errors import StartupError
from nvdp.inventory.devnodes import IMEX_CHANNEL_DEV_DIR

LOGGER = "nvidia-device-plugin"


class ChannelCheck(Struct, frozen=True):
    """The channels found, the ones left out (with what was looked for), and the problem that stops
    the plugin (None when it may go on)."""

    present: tuple[int, ...] = ()
    ignored: tuple[str, ...] = ()
    problem: str | None = None


def channel_path(channel: int) -> str:
    return f"{IMEX_CHANNEL_DEV_DIR}/channel{channel}"


def dev_root_seen(container_driver_root: str, is_dir: Callable[[str], bool]) -> str:
    """Where the plugin sees the driver's /dev: the container driver root if it has a /dev folder, else /."""
    if container_driver_root and is_dir(posixpath.join(container_driver_root, "dev")):
        return container_driver_root
    return "/"


def candidates(channel: int, dev_root: str) -> list[str]:
    """Where channel N is looked for, in order: under the dev root, then at its own path."""
    path = channel_path(channel)
    under_root = posixpath.join(dev_root, path.lstrip("/"))
    return [under_root] if under_root == path else [under_root, path]


def check_channels(
    config: Config, *, is_char_device: Callable[[str], bool], is_dir: Callable[[str], bool]
) -> ChannelCheck:
    """Which configured channels exist; `is_char_device(path)` says whether `path` is a character device."""
    imex = config.imex
    dev_root = dev_root_seen(config.flags.plugin.container_driver_root, is_dir)
    present: list[int] = []
    ignored: list[str] = []
    for channel in imex.channel_ids:
        looked = candidates(channel, dev_root)
        if any(is_char_device(path) for path in looked):
            present.append(channel)
            continue
        where = " and ".join(looked)
        if imex.required:
            problem = (
                f"imex.required: requested IMEX channel channel{channel} does not exist (no character device "
                f"at {where}). Create the channel's device node on the host (character device, major "
                "number of nvidia-caps-imex-channels in /proc/devices, minor {channel}; see NVIDIA's IMEX "
                "documentation) and mount it into the plugin, or unset imex.required (--imex-required / "
                "IMEX_REQUIRED) to start without it"
            )
            return ChannelCheck(tuple(present), tuple(ignored), problem)
        ignored.append(f"channel{channel} (no character device at {where})")
    return ChannelCheck(tuple(present), tuple(ignored))


def is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def channels_on_node(config: Config, log: logging.Logger | None = None) -> Config:
    """`config` with `imex.channelIDs` narrowed to the channels this node has; raises StartupError
    when a required channel is missing."""
    if not config.imex.channel_ids:
        return config
    logger = log or logging.getLogger(LOGGER)
    check = check_channels(config, is_char_device=is_char_device, is_dir=os.path.isdir)
    if check.problem is not None:
        raise StartupError(check.problem)
    for channel in check.present:
        logger.info("Selecting IMEX channel channel%d", channel)
    for what in check.ignored:
        logger.warning("Ignoring requested IMEX channel %s", what)
    if check.present == config.imex.channel_ids:
        return config
    return replace(config, imex=replace(config.imex, channel_ids=check.present))
