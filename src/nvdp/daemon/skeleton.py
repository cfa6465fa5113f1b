"""The one shape of an nvdp daemon's process; each daemon supplies only its own work (`DaemonWork`).

Every daemon (device plugin, DRA plugin, MPS control daemon, GPU feature discovery) runs the same way,
written here once:

1. its HTTP endpoints start (a port taken ends the start), and Node Events are attached;
2. the per-node config is followed (nvdp.daemon.pernode.nodeconfig) and its rule
(nvdp.daemon.pernode.nodechoice) puts the first
   config in force through the daemon's `switch`, the mode gate (nvdp.daemon.pernode.mode) checking each mode
   switch; then the daemon `begin`s its serving;
3. the run loop (nvdp.daemon.runloop) waits: SIGHUP or a node config change chooses again (`replanning`
   announces it), a pending entry is tried again when due, and the daemon's `step` does its own
   periodic work; a stop signal or a dead guarded thread ends the loop;
4. on the way out the endpoints stop, the daemon `stop`s its work, the follower stops and the Events
   still queued are sent.

What the daemon reports about its node's config and mode goes through `report`: always the log, and
an Event where the process records Events and nvdp.daemon.report.event_reasons says this daemon owns the
reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from msgspec import Struct

from nvdp.daemon.errors import CannotGoOn
from nvdp.daemon.report.recording import Recorder
from nvdp.daemon.runloop import EXIT_FAILED, Inbox, Wake, Wakes, run

if TYPE_CHECKING:
    from nvdp.config.model import Mode
    from nvdp.daemon.api import ApiConnection
    from nvdp.daemon.pernode.mode import ModeGate, NodeApi
    from nvdp.daemon.pernode.nodechoice import NodeConfigRule
    from nvdp.daemon.pernode.nodeconfig import Chosen, NodeConfig, NodeConfigSettings
    from nvdp.daemon.report.endpoints import HttpEndpoints

SIGHUP_WHY = "Received SIGHUP"
NODE_CONFIG_WHY = "Node config changed"
RETRY_WHY = "Trying the pending config again"


class DaemonWork:
    """What one daemon does; the skeleton calls these, each daemon overrides what it needs."""

    own_mode: Mode | None = None  # the mode in which it advertises (None: it follows, never records)

    def switch(self, chosen: Chosen | None) -> None:
        """Put `chosen` in force (None: the config file), or raise ConfigRefused serving as before."""
        raise NotImplementedError

    def mode_api(self) -> NodeApi | None:
        """The mode policy's API reads (nvdp.daemon.pernode.mode.NodeApi); None: a mode switch needs a
        restart."""
        return None

    def begin(self) -> int | None:
        """After the first config is in force: start serving; an exit code ends the process."""
        return None

    def start_failed(self, err: Exception) -> int | None:
        """The start failed with `err`: log it and return the exit code (None: go on serving);
        raise it again when it is not a start failure of this daemon."""
        raise err

    def replanning(self, why: str, *, retry: bool) -> None:
        """The loop is about to choose the config again (`why`; `retry`: a pending entry is due)."""

    def step(self, wakes: Wakes) -> int | None:
        """After each wake-up (an empty Wakes when the wait timed out); an exit code ends the loop."""
        return None

    def wake_after(self) -> float | None:
        """How long the loop may wait without a wake-up (None: no limit)."""
        return None

    def finish(self, code: int) -> int:
        """The loop ended with `code`; the process's exit code."""
        return code

    def stop(self) -> None:
        """Stop what `switch` and `begin` started (also after a failed start)."""


Serve = Callable[[], "list[HttpEndpoints]"]


class Events(Struct, frozen=True):
    """Where a daemon's Node Events go: `node_name` (else NODE_NAME) through the pod's service
    account, or `kubeconfig` (else KUBECONFIG)."""

    node_name: str | None = None
    kubeconfig: str | None = None


class Skeleton:
    """One daemon process: its recorder, API connection, node config, rule, mode gate and loop.

    `guard`: a dead guarded thread or HTTP server ends the process (nvdp.daemon.guard); the plugins.
    """

    def __init__(self, name: str, log: logging.Logger, env: Mapping[str, str], *,
                 kubeconfig: str | None = None, guard: bool = True) -> None:
        self.name = name
        self.log = log
        self.env = env
        self.guard = guard
        self.recorder = Recorder(owner=name)
        self.kubeconfig = kubeconfig
        self._api: ApiConnection | None = None
        self.inbox: Inbox | None = None
        self.node_config: NodeConfig | None = None
        self.rule: NodeConfigRule | None = None
        self.gate: ModeGate | None = None
        self.endpoints: list[HttpEndpoints] = []

    # --- what every daemon uses ------------------------------------------------------------------

    @property
    def api(self) -> ApiConnection:
        """The process's one API connection (its module loads only in a daemon that uses the API)."""
        if self._api is None:
            from nvdp.daemon.api import ApiConnection

            self._api = ApiConnection(self.kubeconfig)
        return self._api

    def report(self, reason: str, message: str, *, warning: bool = True) -> None:
        """Log, and record an Event on the Node where this daemon owns the reason."""
        (self.log.warning if warning else self.log.info)("%s: %s", reason, message)
        self.recorder.event(reason, message, warning=warning)

    def record_events(self, events: Events) -> None:
        """Send this process's Node Events (nothing is sent without a node name or API access)."""
        from nvdp.daemon.report.node_events import NodeEvents

        self.recorder.attach_events(NodeEvents.from_env(self.env, self.log, component=self.name,
                                                        node_name=events.node_name,
                                                        kubeconfig=events.kubeconfig))

    # --- the process -----------------------------------------------------------------------------

    def run(self, work: DaemonWork, *, settings: NodeConfigSettings | None = None,
            config_file: str | None = None, serve: Serve | None = None, serve_fix: str = "",
            events: Events | None = None,
            on_labels: Callable[[Mapping[str, str]], None] | None = None) -> int:
        """The whole life of the process; its exit code.

        `settings`: the per-node config (None: a single config file, `config_file`); `serve`: starts
        the HTTP endpoints (an OSError is logged with `serve_fix`); `events`: where Node Events go
        (None: nowhere, the log is all); `on_labels`: every label state of the Node, from the
        follower's watch.
        """
        from nvdp.daemon.guard import on_fatal

        inbox = self.inbox = Inbox()
        if self.guard:
            on_fatal(inbox.post_fatal)
        try:
            if serve is not None:
                try:
                    self.endpoints = serve()
                except OSError as err:
                    self.log.error("%s; %s", err, serve_fix)
                    return EXIT_FAILED
            if events is not None:
                self.record_events(events)
            code = self._start(work, settings, config_file, on_labels)
            if code is not None:
                return code
            code = run(inbox, lambda wakes: self._step(work, wakes), self.log, lambda: self._timeout(work))
            return work.finish(code)
        finally:
            self._shutdown(work)
            if self.guard:
                on_fatal(None)
            inbox.close()

    def _start(self, work: DaemonWork, settings: NodeConfigSettings | None, config_file: str | None,
               on_labels: Callable[[Mapping[str, str]], None] | None) -> int | None:
        from nvdp.config.loader import config_file_path
        from nvdp.daemon.pernode.mode import ModeGate
        from nvdp.daemon.pernode.nodechoice import NodeConfigRule

        try:
            self.node_config = self._follow(settings, config_file, on_labels)
            self.rule = NodeConfigRule(self.node_config, self.report, self.log,
                                       config_file=config_file_path(config_file, self.env))
            self.gate = ModeGate(work.own_mode, work.mode_api(), self.report, self.log,
                                 per_node=self.node_config is not None)
            self.rule.start(work.switch)
            return work.begin()
        except CannotGoOn as err:
            self.log.error("%s%s", err.prefix, err)
            return EXIT_FAILED
        except Exception as err:
            return work.start_failed(err)

    def _follow(self, settings: NodeConfigSettings | None, config_file: str | None,
                on_labels: Callable[[Mapping[str, str]], None] | None) -> NodeConfig | None:
        """Follow the node label and the entries directory (CONFIG_DIR mode only)."""
        from nvdp.daemon.pernode.nodeconfig import follow_settings

        inbox = self.inbox
        assert inbox is not None
        return follow_settings(settings, config_file, lambda: inbox.post(Wake.NODE_CONFIG), self.log,
                               recorder=self.recorder, on_labels=on_labels)

    def _step(self, work: DaemonWork, wakes: Wakes) -> int | None:
        rule = self.rule
        assert rule is not None
        try:
            if Wake.RELOAD in wakes or Wake.NODE_CONFIG in wakes:  # a burst of changes re-plans once
                forced = Wake.RELOAD in wakes
                work.replanning(SIGHUP_WHY if forced else NODE_CONFIG_WHY, retry=False)
                rule.again(work.switch, forced=forced)
            elif rule.retry_due():  # a mode switch that waited for GPU pods to go
                work.replanning(RETRY_WHY, retry=True)
                rule.again(work.switch, forced=False)
        except CannotGoOn as err:
            self.log.error("%s%s", err.prefix, err)
            return EXIT_FAILED
        return work.step(wakes)

    def _timeout(self, work: DaemonWork) -> float | None:
        delays = [delay for delay in (work.wake_after(), self.rule.retry_in() if self.rule else None)
                  if delay is not None]
        return min(delays) if delays else None

    def _shutdown(self, work: DaemonWork) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()
        work.stop()
        if self.node_config is not None:
            self.node_config.stop()
        self.recorder.close()
