"""From config and inventory to the set of supervised MPS daemons, one per MPS-shared resource."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from nvdp.config.model import Config
from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Inventory
from nvdp.mps.commands import MpsSettings, mps_settings
from nvdp.mps.compute_mode import ComputeModes
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.supervisor import ResourceDaemon
from nvdp.plan import Plan, plan


def mps_settings_for(resource_plan: Plan, inventory: Inventory) -> list[MpsSettings]:
    """Settings for every resource the plan shares with MPS (MpsConfigError if one cannot be)."""
    return [mps_settings(r, inventory) for r in resource_plan.resources if r.sharing == "mps"]


def plan_mps(config: Config, inventory: Inventory) -> list[MpsSettings]:
    """The same plan the plugin makes (PlanError on a bad config), reduced to its MPS resources."""
    return mps_settings_for(plan(config, inventory), inventory)


class Daemons:
    """Starts and stops the daemons of one configuration together."""

    def __init__(
        self,
        settings: Sequence[MpsSettings],
        root: Path,
        modes_factory: Callable[[], ComputeModes],
        log: logging.Logger,
        probe_interval_s: float,
        *,
        recorder: Recorder,
    ) -> None:
        self.settings = list(settings)
        self.root = root
        self.modes_factory = modes_factory
        self.log = log
        self.recorder = recorder
        self.probe_interval_s = probe_interval_s
        self.running: list[ResourceDaemon] = []
        self.modes: ComputeModes | None = None

    def start(self) -> None:
        if not self.settings:
            return
        self.modes = modes = self.modes_factory()
        for settings in self.settings:
            daemon = ResourceDaemon(
                settings,
                ResourcePaths(self.root, settings.resource_name),
                modes,
                self.log,
                probe_interval_s=self.probe_interval_s,
                recorder=self.recorder,
            )
            daemon.start()
            self.running.append(daemon)

    def stop(self) -> bool:
        """Stop every daemon, each whatever the others did; False if a compute mode stayed changed."""
        restored = True
        while self.running:
            daemon = self.running.pop()
            try:
                restored = daemon.stop() and restored
            except Exception:
                self.log.exception("%s: unexpected error while stopping", daemon.name)
                restored = False
        if self.modes is not None:
            try:
                self.modes.close()
            except Exception:
                self.log.exception("unexpected error closing NVML")
            self.modes = None
        return restored
