"""A plugin's GPU health: the ledger of the GPUs that are down (it outlives re-plans) and the monitor
(nvdp.daemon.health) that follows them for the config in force."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nvdp.config.model import Config
    from nvdp.daemon.health import HealthMonitor, OnNotice
    from nvdp.daemon.report.recording import Recorder
    from nvdp.health.ledger import Change, Ledger
    from nvdp.inventory.model import Inventory


class OnHealth(Protocol):
    def __call__(self, unhealthy: frozenset[str], changes: Sequence[Change]) -> None: ...


class HealthWatch:
    """`writer`: the daemon named in the record on disk (nvdp.health.state)."""

    def __init__(self, log: logging.Logger, recorder: Recorder, writer: str) -> None:
        self._log = log
        self._recorder = recorder
        self._writer = writer
        self.ledger: Ledger | None = None
        self.monitor: HealthMonitor | None = None

    def open_ledger(self, config: Config) -> Ledger:
        """The ledger with `config`'s settings; the first one holds the faults of the record on disk."""
        from nvdp.health.settings import open_ledger

        self.ledger = open_ledger(config, self._log, self.ledger)
        return self.ledger

    def start(self, config: Config, inventory: Inventory, on_health: OnHealth,
              on_notice: OnNotice | None = None) -> None:
        """Follow `inventory`'s GPUs under `config` (a monitor already running is stopped first);
        `on_notice`: what the monitor sees that takes no GPU down (nvdp.daemon.health.OnNotice)."""
        from nvdp.daemon.health import monitor_for

        self.stop()
        self.monitor = monitor_for(config, inventory, self.open_ledger(config), on_health, self._log,
                                   recorder=self._recorder, writer=self._writer, on_notice=on_notice)
        self.monitor.start()

    def stop(self, timeout: float | None = None) -> None:
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            monitor.stop(timeout=timeout) if timeout is not None else monitor.stop()

    def stalled(self, now: float) -> str | None:
        """Why the monitor's loop looks stuck; None when fine or not running."""
        return self.monitor.stalled(now) if self.monitor is not None else None
