"""The one per-node config rule, for the plugin, the MPS control daemon and GPU feature discovery.

Which entry a node runs is NVIDIA's config-manager order (`nvdp.config.select`). What a daemon does
when that entry cannot be used is this module's job, the same for all three:

- at start (nothing runs yet) be lenient: a label naming an entry that does not exist, or one that
  does not load, is reported and the daemon starts on the entry it gets without the label
  (`config.default`, then the fallbacks) rather than not at all;
- later, an entry that cannot be chosen or does not load is reported and the running one stays;
- a rejected entry is remembered, so it is not tried (and reported) again until the label, the
  entry's content or a SIGHUP says to;
- an applied switch to another entry, or to new content of the same one, is reported too;
- an entry that cannot be put in force *yet* (`ConfigPending`: a mode switch while GPU pods run,
  nvdp.daemon.pernode.mode) is reported once, not remembered as rejected, and tried again every
  `RETRY_PENDING_S`
  (`retry_in` / `retry_due` give the daemon's loop its wake-ups) until it goes in or the choice moves.

The daemon supplies one callable, `switch(chosen)`, which loads the entry and puts it in force, or
raises `ConfigRefused` (with the cause and the fix) leaving what runs untouched. Without a
config directory (a single config file) `chosen` is None and only SIGHUP switches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from nvdp.config.select import SelectionError, UnknownEntry
from nvdp.daemon.pernode.nodeconfig import Chosen, NodeConfig

# A pending entry is tried again this often (each try may cost the daemon an API list).
RETRY_PENDING_S = 10.0


class ConfigRefused(Exception):
    """The entry cannot be put in force; the message says why and what to change."""


class ConfigPending(ConfigRefused):
    """The entry cannot be put in force yet; the rule tries it again on later wake-ups.

    `reason` names the Event; `notify` False logs the refusal without an Event (when another daemon
    of the node records it).
    """

    reason = "ConfigPending"

    def __init__(self, message: str, *, notify: bool = True) -> None:
        super().__init__(message)
        self.notify = notify


class Report(Protocol):
    def __call__(self, reason: str, message: str, *, warning: bool = True) -> None: ...


Switch = Callable[[Chosen | None], None]


class NodeConfigRule:
    """The entry in force and the one rejected last; `start` once, then `again` on each wake-up."""

    def __init__(self, node_config: NodeConfig | None, report: Report, log: logging.Logger, *,
                 config_file: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`config_file`: without per-node config, the one file read (None: the built-in defaults)."""
        self.node_config = node_config
        self._config_file = config_file
        self._report = report
        self._log = log
        self._clock = clock
        self.current: Chosen | None = None
        self.rejected: Chosen | None = None
        # The entry that could not go in yet (ConfigPending), the one last reported, when last tried.
        self.pending: Chosen | None = None
        self._pending_reported: Chosen | None = None
        self._pending_tried_at = 0.0

    def describe(self) -> str:
        if self.current is not None:
            return self.current.describe()
        if self._config_file:
            return f"the config file {self._config_file}"
        return "the built-in defaults (no config file)"

    @property
    def entry(self) -> str:
        """The entry in force ("" with a single config file)."""
        return (self.current.entry or "") if self.current is not None else ""

    def start(self, switch: Switch) -> None:
        """Put the first config in force; raises ConfigRefused or SelectionError when none can be."""
        node_config = self.node_config
        if node_config is None:
            switch(None)
            self._log.info("Config in force: %s", self.describe())
            return
        chosen = node_config.choose(lenient=True)
        try:
            switch(chosen)
        except ConfigRefused as err:
            if chosen.selection.reason != "label":
                raise
            try:
                fallback = node_config.without_label()
            except (SelectionError, OSError):
                raise err from None
            self._report("InvalidConfig", f"config entry {chosen.entry!r} chosen by the node label is "
                         f"invalid; starting with {fallback.describe()} instead:\n{err}")
            self.rejected = chosen
            switch(fallback)
            chosen = fallback
        self.current = chosen
        self._log.info("Config in force: %s", self.describe())

    def again(self, switch: Switch, *, forced: bool) -> bool:
        """Choose again after a wake-up (`forced`: SIGHUP, reload even if nothing changed).

        Returns whether a new config was put in force.
        """
        node_config = self.node_config
        if node_config is None:
            if forced:
                return self._try(switch, None)
            return False
        try:
            chosen = node_config.choose()
        except SelectionError as err:
            reason = "UnknownConfig" if isinstance(err, UnknownEntry) else "ConfigSelectionFailed"
            self._report(reason, f"{err}; still serving {self.describe()}")
            return self._try(switch, self.current) if forced else False
        if not forced and chosen == self.current:
            self._drop_pending()  # the choice came back to what runs: nothing waits any more
            return False
        if not forced and chosen == self.rejected:
            return False  # already tried and reported: wait for the label or the entry
        return self._try(switch, chosen)

    def retry_in(self) -> float | None:
        """Seconds until a pending entry is due to be tried again; None when nothing is pending."""
        if self.pending is None:
            return None
        return max(0.0, self._pending_tried_at + RETRY_PENDING_S - self._clock())

    def retry_due(self) -> bool:
        return self.pending is not None and self.retry_in() == 0.0

    def _drop_pending(self) -> None:
        if self.pending is not None:
            self._log.info("No longer waiting to put %s in force", self.pending.describe())
        self.pending = self._pending_reported = None

    def _try(self, switch: Switch, chosen: Chosen | None) -> bool:
        previous = self.current
        try:
            switch(chosen)
        except ConfigPending as err:
            self._pend(chosen, err)
            return False
        except ConfigRefused as err:
            self._drop_pending()
            self._log.error("Reload failed; still serving the previous configuration.\n%s", err)
            if chosen is None:
                return False
            if chosen != previous:
                self.rejected = chosen
            self._report("InvalidConfig", f"config {chosen.describe()} was not applied; still serving "
                         f"{self.describe()}:\n{err}")
            return False
        self.current, self.rejected = chosen, None
        self.pending = self._pending_reported = None
        self._log.info("Config in force: %s", self.describe())
        moved = chosen is not None and previous is not None and (chosen.entry, chosen.digest) != (
            previous.entry, previous.digest)
        if moved:
            assert chosen is not None and previous is not None
            self._report("ConfigApplied", f"now serving {chosen.describe()}, "
                         f"previously {previous.describe()}", warning=False)
        return True

    def _pend(self, chosen: Chosen | None, err: ConfigPending) -> None:
        """Not yet: keep what runs, report once per wanted entry, try again later."""
        self._pending_tried_at = self._clock()
        if chosen is None:  # a single config file: only a SIGHUP tries again
            self._log.warning("%s: %s; still serving %s", err.reason, err, self.describe())
            return
        self.pending = chosen
        if chosen == self._pending_reported:
            self._log.info("%s still pending (%s): %s", chosen.describe(), err.reason, err)
            return
        self._pending_reported = chosen
        message = (f"config {chosen.describe()} is not applied yet; still serving {self.describe()}; "
                   f"trying again every {RETRY_PENDING_S:g} s:\n{err}")
        if err.notify:
            self._report(err.reason, message)
        else:
            self._log.warning("%s: %s", err.reason, message)
