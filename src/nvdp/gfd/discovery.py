"""One labelling pass per wake-up or interval: NVML -> Inventory, config -> Plan, both -> labels -> output.

NVML is re-read every `sleepInterval`, the health record is looked at every HEALTH_POLL_S, and writes
happen only when the label set changes; a failed publish is tried again with a back-off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

from nvdp.config.loader import load_config
from nvdp.config.model import Config
from nvdp.daemon.runloop import EXIT_FAILED, EXIT_OK, Wakes
from nvdp.gfd.host import read_host_facts
from nvdp.gfd.labeller import labelling_pass
from nvdp.gfd.labels import HostFacts, LabelError
from nvdp.gfd.options import GFD_ENV_VARS, ProcessOptions, parse_duration
from nvdp.gfd.publish import Output
from nvdp.health.state import FILE as HEALTH_FILE
from nvdp.inventory.model import Inventory

FIRST_READ_TIMEOUT_S = 60.0
MIN_INTERVAL_S = 1.0
RETRY_S = (1.0, 60.0)  # back-off of failed publishes: first, most
# How often the plugin's health record is looked at (one stat) between passes, so that the health
# labels follow a GPU going down or coming back within seconds, not at the next sleepInterval.
HEALTH_POLL_S = 2.0

log = logging.getLogger("nvdp.gfd")


def load(opts: ProcessOptions, env: Mapping[str, str]) -> Config:
    return load_config(opts.config_file, env, opts.overrides, env_vars=GFD_ENV_VARS)


def discover_gpus(config: Config) -> Inventory:
    from nvdp.inventory.nvml import discover

    return discover(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)


class Discovery:
    """One labelling pass per wake-up or interval; its edges (NVML, clock, output) are injectable for tests.

    `step` is the run loop's step (nvdp.daemon.runloop); `timeout` says when the next pass is due.
    """

    def __init__(
        self,
        opts: ProcessOptions,
        config: Config,
        output: Output,
        discover: Callable[[Config], Inventory] = discover_gpus,
        clock: Callable[[], float] = time.monotonic,
        first_labels: threading.Event | None = None,
        report: Callable[[str, str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.opts = opts
        self.config = config
        self.output = output
        self._discover = discover
        self._clock = clock
        self._wall_clock = wall_clock
        self._first_labels = first_labels
        self._report = report  # an Event on the Node, where the per-node config records them
        self._last_error: str | None = None
        self._started = clock()
        self._waiting_warned = False
        self._next_read = 0.0
        self._retry = RETRY_S[0]
        self._delay: float = 0.0
        self.inventory: Inventory | None = None
        self.passes = 0
        self._health_stamp: tuple[int, int] | None = None  # the record's (mtime, size) at the last pass

    @property
    def interval_s(self) -> float:
        return max(parse_duration(self.config.flags.gfd.sleep_interval), MIN_INTERVAL_S)

    def use(self, config: Config) -> None:
        """A new config: read the GPUs again on the next pass."""
        self.config = config
        self._next_read = 0.0

    def host_facts(self, inventory: Inventory) -> HostFacts:
        return read_host_facts(inventory, self.config.flags.gfd.machine_type_file, self.opts.sysfs_root,
                               self.config.flags.plugin.health_state_dir)

    def health_unchanged(self) -> bool:
        """Whether the health record is as at the last pass (always true without one configured)."""
        directory = self.config.flags.plugin.health_state_dir
        if not directory:
            return True
        try:
            info = os.stat(os.path.join(directory, HEALTH_FILE))
            stamp: tuple[int, int] | None = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        unchanged = stamp == self._health_stamp
        self._health_stamp = stamp
        return unchanged

    def read_gpus(self) -> Inventory | None:
        from nvdp.inventory.nvml import NvmlUnavailable

        try:
            return self._discover(self.config)
        except NvmlUnavailable as e:
            if self.config.flags.fail_on_init_error:
                raise
            log.error("%s; failOnInitError is false: keeping the current labels, retrying in %s", e,
                      self.config.flags.gfd.sleep_interval)  # fmt: skip
            return None

    def label_once(self, inventory: Inventory) -> None:
        result = labelling_pass(self.config, inventory, self.host_facts(inventory))
        if result.plan_error != self._last_error:
            if result.plan_error:
                message = (f"the config cannot apply to this node's GPUs, so the plugin advertises nothing "
                           f"and the labels show no sharing: {result.plan_error}")  # fmt: skip
                log.error("%s", message)
                if self._report is not None:
                    self._report("InvalidConfig", f"gpu-feature-discovery: {message}")
            self._last_error = result.plan_error
        now = None if self.config.flags.gfd.no_timestamp else int(self._wall_clock())
        changes = self.output.publish(result.labels, now)
        self.passes += 1
        if changes:
            shown = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(changes.items()))
            log.info("labels changed: %s", shown)

    def timeout(self) -> float:
        return self._delay

    def _poll_delay(self) -> float:
        until_read = self._next_read - self._clock()
        return min(until_read, HEALTH_POLL_S) if self.config.flags.plugin.health_state_dir else until_read

    def step(self, wakes: Wakes | None = None) -> int | None:
        """One pass: read NVML when due, label, and say when to come back; an exit code ends the loop."""
        oneshot = self.config.flags.gfd.oneshot
        now = self._clock()
        due = now >= self._next_read
        health_unchanged = self.health_unchanged()
        settled = self.passes > 0 and self._retry == RETRY_S[0]  # labelled, and no failed publish to retry
        if wakes is not None and wakes.timed_out and not due and health_unchanged and settled:
            self._delay = self._poll_delay()
            return None  # a health poll that found nothing new
        if due:
            self.inventory = self.read_gpus()
            self._next_read = now + self.interval_s
        if self._first_labels is not None and not self._first_labels.is_set():
            # Nothing to compare with yet: come back when the labels arrive (Wake.LABELS) or soon.
            waited = self._clock() - self._started
            if waited >= FIRST_READ_TIMEOUT_S and not self._waiting_warned:
                log.warning("node %s: its labels could not be read yet; still trying", self.opts.node_name)
                self._waiting_warned = True
                if oneshot:
                    return EXIT_FAILED
            self._delay = 1.0
            return None
        self._delay = self._poll_delay()
        if self.inventory is not None:
            try:
                self.label_once(self.inventory)
                self._retry = RETRY_S[0]
            except LabelError as e:
                log.error("cannot label this node: %s", e)
            except Exception as e:  # an API or file failure: keep going, try again soon
                if oneshot:
                    log.error("publishing the labels failed: %s", e)
                    return EXIT_FAILED
                log.warning("publishing the labels failed (%s); retrying in %.0f s", e, self._retry)
                self._delay = min(self._delay, self._retry)
                self._retry = min(self._retry * 2, RETRY_S[1])
        return EXIT_OK if oneshot else None
