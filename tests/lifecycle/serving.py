"""A kubelet simulator that behaves as the real kubelet does around registration, and a plugin's
serving side (manager + kubelet.sock watcher) running against it on real sockets.

`DialingKubelet` removes every other socket from its directory when it starts (a restarted kubelet
forgets and removes the plugins' sockets) and dials the plugin back inside Register, before answering
it, as the kubelet does from v1.36: a Register call lasts as long as that dial.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nvdp.config.loader import load_config_text
from nvdp.config.model import Config
from nvdp.daemon.report.recording import Recorder
from nvdp.inventory.model import Inventory
from nvdp.inventory.profile import load_profile
from nvdp.plan import plan
from nvdp.plan.model import Plan
from nvdp.plugin.kubelet_watch import KubeletSocketWatcher
from nvdp.plugin.manager import PluginManager
from sim.kubelet import KubeletSim
from sim.nvml import resolve_profile

LOG = logging.getLogger("test.serving")
GPU = "nvidia.com/gpu"
_DIAL_S = 2.0


class DialingKubelet(KubeletSim):
    def __enter__(self) -> DialingKubelet:
        self.start()
        return self

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.dir):
            if entry.name != self.socket_path.name and entry.name.endswith(".sock"):
                Path(entry.path).unlink(missing_ok=True)
        super().start()

    def _register(self, request: Any) -> str | None:
        with self._lock:
            before = self._plugins.get(request.resource_name)
        refusal = super()._register(request)  # dials in the background
        if refusal is None:
            with self._lock:
                self._lock.wait_for(lambda: self._plugins.get(request.resource_name) is not before, _DIAL_S)
        return refusal

    def registrations_of(self, name: str) -> int:
        with self._lock:
            return sum(1 for r in self.registrations if r["resource_name"] == name)


def node() -> Inventory:
    return load_profile(resolve_profile("a100-sxm-8"))


def config(directory: Path, replicas: int = 1, sharing: str = "timeSlicing") -> Config:
    text = "version: v1\n"
    if replicas > 1:
        text += f"sharing:\n  {sharing}:\n    resources:\n    - name: {GPU}\n      replicas: {replicas}\n"
    return load_config_text(text, env={"DEVICE_PLUGIN_PATH": str(directory)})


def planned(directory: Path, replicas: int = 1, sharing: str = "timeSlicing") -> tuple[Plan, Config]:
    chosen = config(directory, replicas, sharing)
    return plan(chosen, node()), chosen


@contextmanager
def short_dir() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under ~100 bytes."""
    with tempfile.TemporaryDirectory(prefix="nvdp-") as tmp:
        yield Path(tmp)


@contextmanager
def serving(directory: Path, **manager_args: Any) -> Iterator[PluginManager]:
    """A manager serving the plain plan, re-registering on kubelet restarts as the plugin does."""
    first, chosen = planned(directory)
    manager = PluginManager(chosen, node(), LOG, recorder=Recorder(), retry_interval_s=0.05, **manager_args)
    watcher = KubeletSocketWatcher(chosen.flags.plugin.kubelet_socket_path, manager.kubelet_restarted, LOG)
    watcher.start()
    manager.apply(first)
    try:
        yield manager
    finally:
        watcher.stop()
        manager.stop()
