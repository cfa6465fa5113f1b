"""`nvdp`: tools around the plugin (check a config, preview a node's resources, diagnose a node, print
its CDI specs or the ResourceSlices it would publish in DRA mode, show or clear the GPUs held down)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence

from nvdp import __version__


def build_parser() -> argparse.ArgumentParser:
    """The `nvdp` command tree, every parser with help that fits a screen."""
    # Imported here so `nvdp --version` works even if an optional piece fails to import.
    from nvdp.cdi import cli as cdi_cli
    from nvdp.cli import plan as plan_cli
    from nvdp.cli import usage as usage_cli
    from nvdp.config import cli as config_cli
    from nvdp.config.flags import ScreenHelp
    from nvdp.doctor import cli as doctor_cli
    from nvdp.dra import cli as dra_cli
    from nvdp.health import cli as health_cli

    parser = argparse.ArgumentParser(prog="nvdp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"nvdp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config_cli.register(sub)
    plan_cli.register(sub)
    doctor_cli.register(sub)
    cdi_cli.register(sub)
    dra_cli.add_parser(sub)
    health_cli.register(sub)
    usage_cli.register(sub)
    for _, command in commands(parser):
        command.formatter_class = ScreenHelp
    return parser


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the tree under `parser` with the words that reach it (`("health", "clear")`),
    `parser` itself first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, (*path, name))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        # `nvdp plan -o json | head` closes the pipe early; that is not an error worth a traceback.
        sys.stderr.close()
        return 0
