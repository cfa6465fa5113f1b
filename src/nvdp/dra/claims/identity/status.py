"""The claim's `status.devices` entries of this driver (KEP-4817), written once the claim is prepared.

Written by server-side apply of the driver's own entries (nvdp.kube.apply_device_status, field manager
the driver's name), so the entries of other drivers in the same claim stay theirs. A write that fails
is tried again at the plugin's next tick; one the API server refuses for good (no right to write, the
claim gone, an entry it does not accept) is logged once and not repeated. The status is for
monitoring: the containers get their devices either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

# Writes this driver's entries of a claim's status (nvdp.kube.apply_device_status bound to the client
# and driver): namespace, name, entries.
StatusWriter = Callable[[str, str, list[dict[str, Any]]], None]


class StatusRefused(Exception):
    """The API server refuses the write for good; trying again changes nothing."""


class ClaimStatus:
    """Writes prepared claims' status entries through `writer` (None: not written, as in tests and
    previews)."""

    def __init__(self, writer: StatusWriter | None, log: logging.Logger) -> None:
        self._writer = writer
        self._log = log

    def report(self, namespace: str, name: str, entries: list[dict[str, Any]]) -> bool:
        """True when done: written, refused for good, or nothing to write with; False to try again."""
        if self._writer is None or not entries:
            return True
        try:
            self._writer(namespace, name, entries)
        except StatusRefused as err:
            self._log.warning("Not writing the devices into the status of claim %s/%s: %s", namespace, name,
                              err)
            return True
        except Exception as err:
            self._log.warning("Cannot write the devices into the status of claim %s/%s (tried again at the "
                              "next tick): %s", namespace, name, err)
            return False
        return True
