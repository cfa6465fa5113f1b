"""The health settings of a config, and the node's ledger as a daemon starts it (from its record, if any).

Both plugins (device plugin, DRA) call these, so the two modes keep one rule for what a restart
remembers.
"""

from __future__ import annotations

import logging
import time

from nvdp.config.durations import recovery_after_seconds
from nvdp.config.model import Config
from nvdp.health.ledger import Ledger, Settings
from nvdp.text import short_list


def settings_from_config(config: Config) -> Settings:
    plugin = config.flags.plugin
    return Settings(after=recovery_after_seconds(plugin.health_recovery_after),
                    flap_limit=plugin.health_flap_limit)


def open_ledger(config: Config, log: logging.Logger, ledger: Ledger | None = None,
                now: float | None = None) -> Ledger:
    """The daemon's ledger with the config's settings: `ledger` kept (a reload forgets no fault), or
    on first use a new one holding the faults of the record in the config's `healthStateDir` (a record
    that cannot be read is reported and left alone: every GPU then starts healthy)."""
    if ledger is not None:
        ledger.settings = settings_from_config(config)
        return ledger
    ledger = Ledger(settings_from_config(config))
    directory = config.flags.plugin.health_state_dir
    if not directory:
        return ledger
    from nvdp.health.state import read_usable_state  # only with a record to read (module count)

    record = read_usable_state(directory, log, "Health record not used")
    if record is None:
        return ledger
    taken = ledger.restore(record, time.time() if now is None else now)
    if taken:
        log.warning("Health record in %s: %d GPU(s) stay down as before the restart: %s", directory,
                    len(taken), short_list(f"{f.gpu} ({ledger.state(f)}: {f.reason})" for f in taken))
    return ledger
