"""Why a daemon cannot serve: errors raised while preparing a config, with the fix in the message."""

from __future__ import annotations


class StartupError(Exception):
    """Why the plugin cannot serve with this config on this node; the message has the fix."""


class NvmlMissing(Exception):
    """NVML could not be initialised; `fail` says whether the config wants the plugin to exit."""

    fail = True


class CannotGoOn(Exception):
    """The daemon cannot run on this node whatever the config: the process logs `prefix` and the
    message at ERROR and exits 1."""

    prefix = ""
