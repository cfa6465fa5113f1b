"""`nvdp`: tools around the plugin (check a config, preview a node's resources, diagnose a node, print
its CDI specs or the ResourceSlices it would publish in DRA mode, show or clear the GPUs held down)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nvdp import __version__


def main(argv: Sequence[str] | None = None) -> int:
    # Imported here so `nvdp --version` works even if an optional piece fails to import.
    from nvdp.cdi import cli as cdi_cli
    from nvdp.config import cli as config_cli
    from nvdp.doctor import cli as doctor_cli
    from nvdp.dra import cli as dra_cli
    from nvdp.health import cli as health_cli
    from nvdp.plan import cli as plan_cli

    parser = argparse.ArgumentParser(prog="nvdp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"nvdp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config_cli.register(sub)
    plan_cli.register(sub)
    doctor_cli.register(sub)
    cdi_cli.register(sub)
    dra_cli.add_parser(sub)
    health_cli.register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        # `nvdp plan --json | head` closes the pipe early; that is not an error worth a traceback.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
