"""The daemons' observability: the flags --metrics-address and --health-address (off unless given),
the servers they ask for, and the /metrics answer of a series registry."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from nvdp.daemon.report.endpoints import HttpEndpoints, Response, Route, parse_address, start_endpoints

if TYPE_CHECKING:
    from nvdp.daemon.report.recording import Recorder

METRICS_ADDRESS_ENV = "METRICS_ADDRESS"
HEALTH_ADDRESS_ENV = "HEALTH_ADDRESS"
# The fix logged after a port that cannot be bound.
PORT_FIX = "choose another port (--metrics-address / --health-address)"


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    # Off unless given.
    parser.add_argument(
        "--metrics-address", default=env.get(METRICS_ADDRESS_ENV) or None, metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz (:9445)",
    )
    parser.add_argument(
        "--health-address", default=env.get(HEALTH_ADDRESS_ENV) or None, metavar="HOST:PORT",
        help="serve only /healthz and /readyz (:9447)",
    )


def check_addresses(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2) for an address flag that is not HOST:PORT."""
    for flag in ("metrics_address", "health_address"):
        value = getattr(args, flag, None)
        if value is None:
            continue
        try:
            parse_address(value)
        except ValueError as err:
            parser.error(f"--{flag.replace('_', '-')}: {err}")


def scrape(recorder: Recorder, registry: str, before: Callable[[], None] | None = None) -> Route:
    """/metrics: the series of `registry` in nvdp.daemon.report.metrics (PLUGIN, MPS_DAEMON), after
    `before`."""

    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        series = recorder.enable_metrics()
        if before is not None:
            before()
        return Response(200, generate_latest(getattr(series, registry)), CONTENT_TYPE_LATEST)

    return metrics


def serve(metrics_address: str | None, health_address: str | None, probes: Mapping[str, Route],
          metrics: Route, recorder: Recorder | None, log: logging.Logger, *,
          on_death: Callable[[str], None] | None = None) -> list[HttpEndpoints]:
    """Start the servers the flags ask for (nvdp.daemon.report.endpoints.start_endpoints); with a metrics
    address,
    `recorder` records its metrics from now on. A server that dies ends the process: through
    `on_death`, else as a dead guarded thread does (nvdp.daemon.guard). OSError (a port taken)
    propagates with the address in it."""
    from nvdp.daemon.guard import fatal

    if metrics_address and recorder is not None:
        recorder.enable_metrics()
    if on_death is None:
        def on_death(what: str) -> None:
            fatal(log, what)

    return start_endpoints(metrics_address, health_address, probes, metrics, log, on_death=on_death)
