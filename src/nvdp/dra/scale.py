"""The DRA plugin's dynamic MIG scale warning: once per start, a WARNING in the log and a Warning Event
on the Node when this node publishes partitionable devices and the API server's Kubernetes lacks the
scheduler fix (the message and the rule: nvdp.dra.pool.scale). The version is read in a thread of its
own, so a slow API server never delays the plugin's start."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nvdp.config.model import Config, Mode
from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.scale import SCALE_EVENT, in_force, scale_warning, silenced

if TYPE_CHECKING:
    from nvdp.daemon.report.recording import Recorder


class ScaleGuard:
    """Checks once per process: the first config that puts dynamic MIG in force on this node (at start,
    or a later per-node switch) reads the API server's version; a version without the fix is one
    WARNING and one Event. A failed read is tried again at the next such config."""

    def __init__(self, client: Callable[[], Any], recorder: Recorder, log: logging.Logger,
                 env: Mapping[str, str]) -> None:
        self._client = client
        self._recorder = recorder
        self._log = log
        self._env = env
        self._lock = threading.Lock()
        self._busy = False
        self.done = False
        self.thread: threading.Thread | None = None

    def check(self, config: Config, mode: Mode, devices: Iterable[DraDevice]) -> None:
        """Start the check where dynamic MIG is in force and it has not run to its end in this process."""
        count = in_force(config, mode, devices)
        if not count or silenced(self._env):
            return
        with self._lock:
            if self.done or self._busy:
                return
            self._busy = True
        self.thread = threading.Thread(target=self.run, args=(count,), name="dynamic-mig-scale", daemon=True)
        self.thread.start()

    def run(self, count: int) -> None:
        """Read the version and warn where it lacks the fix; never raises (the warning is advice)."""
        finished = False
        try:
            finished = self._warn(count)
        except Exception:  # advice only: a fault here must not end the plugin
            self._log.exception("The dynamic MIG scale check failed")
        finally:
            with self._lock:
                self._busy = False
                self.done = self.done or finished

    def _warn(self, count: int) -> bool:
        from nvdp.kube import KubeConnectError, classify, get_server_version

        try:
            version = get_server_version(self._client())
        except KubeConnectError:
            return True  # no API access: no Event can be recorded, and the plugin says why elsewhere
        except Exception as err:  # every API failure: tried again with the next config
            failure = classify(err)
            self._log.warning("Cannot read the API server's version for the dynamic MIG scale check "
                              "(%s: %s); it runs again with the next config", failure.kind, failure.detail)
            return False
        message = scale_warning(version.text, version.release, count)
        if message is None:
            if version.release is None:
                self._log.info("The API server's version %r is not one nvdp reads; no dynamic MIG scale "
                               "warning", version.text)
            return True
        self._log.warning("%s", message)
        self._recorder.event(SCALE_EVENT, message)
        return True
