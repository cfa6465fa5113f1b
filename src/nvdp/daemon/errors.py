"""Why the plugin cannot serve: errors raised while preparing a config, with the fix in the message."""

from __future__ import annotations


class StartupError(Exception):
    """Why the plugin cannot serve with this config on this node; the message has the fix."""


class NvmlMissing(Exception):
    """NVML could not be initialised; `fail` says whether the config wants the plugin to exit."""

    fail = True
