"""The DRA plugin's HTTP endpoints: /healthz and /readyz on --health-address, with /metrics on
--metrics-address (the flags: nvdp.daemon.report.observe)."""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import TYPE_CHECKING, Protocol

from nvdp.daemon.report.endpoints import Response, Route
from nvdp.daemon.report.probes import Check, liveness

if TYPE_CHECKING:
    from nvdp.daemon.healthwatch import HealthWatch
    from nvdp.daemon.report.endpoints import HttpEndpoints
    from nvdp.daemon.report.recording import Recorder
    from nvdp.dra.kubelet.server import DraServer
    from nvdp.usage.collect import UsageCollector


class Probed(Protocol):
    """What the DRA plugin's probes read of its process."""

    driver: str
    not_serving_reason: str | None
    server: DraServer | None
    health: HealthWatch


def readyz(process: Probed) -> Response:
    if process.not_serving_reason is not None:
        return Response(503, f"not ready: {process.not_serving_reason}\n".encode())
    registered = process.server is not None and process.server.registered()
    lines = [f"driver {process.driver}: " + ("registered with the kubelet" if registered
                                              else "not registered with the kubelet yet")]
    status = 200 if registered else 503
    return Response(status, "\n".join(["ready" if registered else "not ready", *lines, ""]).encode())


def healthz(process: Probed) -> Response:
    checks = []
    server = process.server
    if server is not None:
        sockets = (server.plugin_socket, server.registration_socket)
        # A missing socket is re-created by the loop within a second; gone for longer is a hang.
        absent = [path for path in sockets if not os.path.exists(path)]
        checks.append(Check("sockets", f"absent: {', '.join(absent)}" if absent else None))
    if process.health.monitor is not None:
        checks.append(Check("health loop", process.health.stalled(time.monotonic())))
    return liveness(checks)


class Served(Protocol):
    @property
    def recorder(self) -> Recorder: ...

    def healthz(self) -> Response: ...

    def readyz(self) -> Response: ...


def serve_probes(process: Served, args: argparse.Namespace, log: logging.Logger,
                 usage: UsageCollector | None = None) -> list[HttpEndpoints]:
    """/healthz and /readyz on --health-address, and with /metrics on --metrics-address (with the usage
    series of `usage`'s collections); a server that dies ends the process (nvdp.daemon.guard)."""
    from nvdp.daemon.report.observe import scrape, serve

    def metrics() -> Response:
        return scrape(process.recorder, "PLUGIN")()

    probes: dict[str, Route] = {"/healthz": process.healthz, "/readyz": process.readyz}
    recorder = process.recorder if args.metrics_address else None
    if recorder is not None and usage is not None:
        from nvdp.usage.series import serve_usage

        serve_usage(recorder, usage, log)
    return serve(args.metrics_address, args.health_address, probes, metrics, recorder, log)
