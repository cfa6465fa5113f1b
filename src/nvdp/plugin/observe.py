"""The plugin's HTTP endpoints: /metrics (with --metrics-address), /healthz and /readyz.

`--metrics-address` (the flags: nvdp.daemon.report.observe) serves all three; `--health-address` only the
probes (no prometheus-client import at all). Given the same address, one server answers both.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable, Mapping

from nvdp.daemon.report.endpoints import HttpEndpoints, Response, Route
from nvdp.daemon.report.observe import scrape, serve
from nvdp.daemon.report.probes import Check, liveness, readiness
from nvdp.daemon.report.recording import Recorder
from nvdp.plugin.grpc_client import server_answers
from nvdp.plugin.state import PluginState

# Each liveness check is bounded, so a stuck plugin answers the probe (not live) instead of timing out
# (the server call: grpc_client.server_answers' timeout).
LOCK_TIMEOUT_S = 2.0


class PluginEndpoints:
    """Answers the probes and scrapes from the running plugin's state."""

    def __init__(self, state: PluginState, recorder: Recorder,
                 call_server: Callable[[str], str | None] = server_answers) -> None:
        self._state = state
        self._recorder = recorder
        self._call_server = call_server

    def readyz(self) -> Response:
        state = self._state
        reason = state.not_serving()
        if reason is not None:
            return readiness(reason, [])
        kubelet = state.kubelet_socket()
        absent = None
        if kubelet is not None and not os.path.exists(kubelet):
            absent = (f"its socket {kubelet} is absent (kubelet not running, or restarting); the "
                      "resources register when it is back")
        return readiness(None, state.resources(), absent)

    def healthz(self) -> Response:
        state = self._state
        checks: list[Check] = []
        responsive = state.responsive(LOCK_TIMEOUT_S)
        if responsive is not None:
            checks.append(Check("manager", None if responsive else f"lock held for over {LOCK_TIMEOUT_S:g}s"))
        for name, socket_path in state.server_sockets():
            # No socket: not started yet (held by a gate, retrying), or removed by a restarting
            # kubelet and being replaced; neither is a hang.
            if os.path.exists(socket_path):
                checks.append(Check(f"server {name}", self._call_server(socket_path)))
        if responsive is not None:
            checks.append(Check("health loop", state.health_stalled(time.monotonic())))
        return liveness(checks)

    def resource_state(self) -> None:
        """The served resources into their series, just before a scrape."""
        resources = self._state.resources()
        self._recorder.resource_state([(r.name, r.healthy, r.unhealthy) for r in resources],
                                      [r.name for r in resources if r.registered])

    def metrics(self) -> Response:
        return scrape(self._recorder, "PLUGIN", self.resource_state)()


def start(state: PluginState, args: argparse.Namespace, log: logging.Logger,
          recorder: Recorder) -> list[HttpEndpoints]:
    """Start the servers the flags ask for; OSError (port taken) propagates with the address in it."""
    endpoints = PluginEndpoints(state, recorder)
    probes: dict[str, Route] = {"/healthz": endpoints.healthz, "/readyz": endpoints.readyz}
    # getattr: a process built from a bare Namespace (tests, embedding) serves nothing.
    metrics_address = getattr(args, "metrics_address", None)
    if metrics_address and getattr(args, "usage_metrics", False):
        serve_usage(state, recorder, log, os.environ)
    return serve(metrics_address, getattr(args, "health_address", None), probes, endpoints.metrics, recorder,
                 log)


def serve_usage(state: PluginState, recorder: Recorder, log: logging.Logger, env: Mapping[str, str]) -> None:
    """The usage series of the devices this plugin handed out (nvdp.usage), from the kubelet's device
    checkpoint beside the registration socket in force: none while nothing is served."""
    from nvdp.config.names import node_name
    from nvdp.daemon.podresources import POD_RESOURCES_ENV, POD_RESOURCES_SOCKET
    from nvdp.usage.collect import UsageCollector, UsageSource, checkpoint_next_to
    from nvdp.usage.series import serve_usage as register

    source = UsageSource(node=node_name(env),
                         pod_resources_socket=env.get(POD_RESOURCES_ENV, "").strip() or POD_RESOURCES_SOCKET)
    register(recorder, UsageCollector(source, checkpoint=lambda: checkpoint_next_to(state.kubelet_socket()),
                                      log=log), log)
