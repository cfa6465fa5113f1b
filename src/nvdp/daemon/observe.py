"""The daemons' observability flags: --metrics-address and --health-address (off unless given)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from nvdp.endpoints import parse_address

METRICS_ADDRESS_ENV = "METRICS_ADDRESS"
HEALTH_ADDRESS_ENV = "HEALTH_ADDRESS"
# The fix logged after a port that cannot be bound.
PORT_FIX = "choose another port (--metrics-address / --health-address)"


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    group = parser.add_argument_group("observability (off unless given)")
    group.add_argument(
        "--metrics-address", default=env.get(METRICS_ADDRESS_ENV) or None, metavar="HOST:PORT",
        help="serve Prometheus metrics at /metrics, and /healthz and /readyz, e.g. :9445 "
        f"(env {METRICS_ADDRESS_ENV})",
    )
    group.add_argument(
        "--health-address", default=env.get(HEALTH_ADDRESS_ENV) or None, metavar="HOST:PORT",
        help=f"serve only /healthz and /readyz, e.g. :9447 (env {HEALTH_ADDRESS_ENV})",
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
