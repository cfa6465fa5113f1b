"""The one error of CDI spec generation and writing."""

from __future__ import annotations


class CdiError(Exception):
    """A CDI spec cannot be made or written. The message names the path, field or device, the cause,
    and the fix (the setting to change, or what to do on the node)."""
