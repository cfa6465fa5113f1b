"""NVIDIA's device-plugin command-line flags, mapped onto config paths, and the help that shows them.

Values stay text here; the loader converts and validates them exactly like environment values,
so a bad flag is reported as a ConfigError naming the flag. `ScreenHelp` is the help of `nvdp` and
the daemons: one line per option where its help allows (the first of its long names and its value in
the left column, the other long names, NVIDIA's aliases and old spellings, at the end of its help),
and a usage line that names the arguments and `[options]` instead of every option, so that it fits a
screen. It lives here, with the flags it shows, so that a daemon's start loads no module for it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from nvdp.config.sources import ENV_VARS, FLAG_PATHS

if TYPE_CHECKING:
    from argparse import _ActionsContainer

# Wider lines are harder to read than a few more of them.
MAX_WIDTH = 100
# What the daemons' help says once instead of on every flag.
ENV_RULE = ("A flag's environment variable is its name in capitals (MIG_STRATEGY) unless its help names "
            "one.")


def env_name(flag: str) -> str:
    """The variable ENV_RULE names for `flag`: MIG_STRATEGY for --mig-strategy."""
    return flag.removeprefix("--").replace("-", "_").upper()


class ScreenHelp(argparse.HelpFormatter):
    """argparse's help, one line per option where it fits, at most MAX_WIDTH columns."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 32,
                 width: int | None = None) -> None:
        if width is None:
            import shutil  # as argparse's own formatter does

            width = min(shutil.get_terminal_size().columns, MAX_WIDTH) - 2
        super().__init__(prog, indent_increment, max_help_position, width)

    def add_usage(self, usage: str | None, actions: Iterable[argparse.Action],
                  groups: Iterable[argparse._MutuallyExclusiveGroup], prefix: str | None = None) -> None:
        if usage is None:
            actions = list(actions)
            words = ["%(prog)s"]
            if any(a.option_strings and a.help != argparse.SUPPRESS for a in actions):
                words.append("[options]")
            words += [self._format_args(a, self._get_default_metavar_for_positional(a))
                      for a in actions if not a.option_strings and a.help != argparse.SUPPRESS]
            usage = " ".join(words)
        super().add_usage(usage, actions, groups, prefix)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        shown = _shown_names(action.option_strings)
        if action.nargs == 0:
            return ", ".join(shown)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(shown)} {value}"

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        others = [name for name in action.option_strings if name not in _shown_names(action.option_strings)]
        if text and others:
            also = f"also {', '.join(others)}"
            text = f"{text[:-1]}; {also})" if text.endswith(")") else f"{text} ({also})"
        return text

    # Option names stay whole: `--mig-strategy` is not broken after `--mig-`.
    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap  # as argparse does: only where help is shown

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


def _shown_names(names: Sequence[str]) -> list[str]:
    """The short names and the first long one; the other long names go to the help."""
    short = [n for n in names if not n.startswith("--")]
    long = [n for n in names if n.startswith("--")]
    return short + long[:1]


# Main flag name -> aliases NVIDIA also accepts.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "--driver-root": ("--nvidia-driver-root",),
    "--dev-root": ("--nvidia-dev-root",),
    "--nvidia-cdi-hook-path": ("--nvidia-ctk-path",),
    "--driver-root-ctr-path": ("--container-driver-root",),
}
BOOL_FLAGS = frozenset(
    {
        "--fail-on-init-error",
        "--pass-device-specs",
        "--gds-enabled",
        "--mofed-enabled",
        "--gdrcopy-enabled",
        "--imex-required",
    }
)
# Each flag's help; its environment variable is named only where it is not the flag's name in
# capitals (ENV_RULE), which `add_config_flag` adds from ENV_VARS.
_HELP = {
    "--mig-strategy": "none, single, mixed or dynamic",
    "--mig-dynamic-profiles": "profiles dynamic MIG offers; default all",
    "--fail-on-init-error": "exit when NVML cannot be initialised",
    "--mps-root": "host folder shared with the MPS daemon",
    "--driver-root": "host path of the NVIDIA driver",
    "--dev-root": "host root of dev/nvidia*",
    "--gdrcopy-enabled": "give containers GDRCopy",
    "--gds-enabled": "give containers GPUDirect Storage",
    "--mofed-enabled": "give containers MOFED",
    "--device-discovery-strategy": "auto or nvml",
    "--pass-device-specs": "return device nodes in Allocate",
    "--device-list-strategy": "envvar,volume-mounts,cdi-annotations,cdi-cri",
    "--device-id-strategy": "uuid or index",
    "--cdi-annotation-prefix": "prefix of CDI annotations",
    "--nvidia-cdi-hook-path": "CDI hook on the host",
    "--cdi-feature-flags": "CDI feature flags, a comma list",
    "--cdi-disable-hooks": "CDI hooks left out: a comma list, or all",
    "--driver-root-ctr-path": "driver root in this container",
    "--shared-devices-allocation-policy": "distributed or packed",
    "--device-plugin-path": "kubelet device-plugin folder",
    "--kubelet-socket": "kubelet registration socket",
    "--health-recovery-after": "quiet time before a re-check: 30s, 5m, never",
    "--health-flap-limit": "downs an hour after which a GPU stays down",
    "--health-state-dir": "host folder of health.json; empty: none",
    "--health-taint-effect": "DRA: NoSchedule or NoExecute on a GPU down",
    "--imex-channel-ids": "IMEX channels: empty or 0",
    "--imex-required": "fail when an IMEX channel is missing",
}
# The value each flag takes, as its help names it.
_METAVARS = {
    "--mig-strategy": "STRATEGY", "--mig-dynamic-profiles": "LIST", "--mps-root": "DIR",
    "--driver-root": "DIR", "--dev-root": "DIR", "--device-list-strategy": "LIST",
    "--nvidia-cdi-hook-path": "PATH", "--cdi-annotation-prefix": "TEXT", "--cdi-feature-flags": "LIST",
    "--cdi-disable-hooks": "LIST",
    "--driver-root-ctr-path": "DIR", "--device-plugin-path": "DIR", "--kubelet-socket": "PATH",
    "--health-recovery-after": "TIME", "--health-flap-limit": "N", "--health-state-dir": "DIR",
    "--imex-channel-ids": "LIST",
}  # fmt: skip


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


# nvdp's commands name the plugin's config file --config; the daemons keep NVIDIA's --config-file.
CONFIG_FLAG = "--config"
DAEMON_CONFIG_FLAG = "--config-file"


def add_config_option(group: _ActionsContainer, help_text: str) -> None:
    """An nvdp command's config file: --config FILE (--config-file, the daemons' spelling, also works),
    read from `args.config_file`."""
    group.add_argument(CONFIG_FLAG, DAEMON_CONFIG_FLAG, dest="config_file", metavar="FILE", help=help_text)


def add_config_arguments(parser: argparse.ArgumentParser, *, file_flag: str = DAEMON_CONFIG_FLAG,
                         listed: bool = True) -> None:
    """Add the config file flag (`file_flag`: a daemon's --config-file, or an nvdp command's --config)
    and every flag that sets a config value.

    `listed`: each flag with its help (nvidia-device-plugin, whose flags are NVIDIA's); otherwise the
    flags are named in one paragraph after the program's own options (`nvidia-device-plugin --help`
    describes each). Flags not given leave no attribute (so they do not override the environment or
    the file); boolean flags accept `--flag` (true) and `--flag=true|false|1|0|yes|no`.
    """
    title = "configuration (flag > environment > config file > default)"
    if file_flag == CONFIG_FLAG:
        add_config_option(parser, "the plugin's config file (default: env CONFIG_FILE, else built-in "
                          "defaults)")
    if listed:
        group = parser.add_argument_group(title)
    else:
        listed_flags = ", ".join(FLAG_PATHS)
        group = parser.add_argument_group(
            title, f"The plugin's flags; `nvidia-device-plugin --help` describes each: {listed_flags}.")
    if file_flag == DAEMON_CONFIG_FLAG:
        (group if listed else parser).add_argument(DAEMON_CONFIG_FLAG, dest="config_file", metavar="PATH",
                                                   help="config file")
    for flag in FLAG_PATHS:
        add_config_flag(group, flag, help_text=None if listed else argparse.SUPPRESS)


def add_config_flag(group: _ActionsContainer, flag: str, *, first: str | None = None,
                    help_text: str | None = None, metavar: str | None = None) -> None:
    """One config flag as the plugin takes it (its aliases, its destination, read by
    `overrides_from_args`), for a command that takes some of the plugin's settings; `first` puts one
    of its names first in the help."""
    names = [flag, *FLAG_ALIASES.get(flag, ())]
    if first is not None:
        names.remove(first)
        names.insert(0, first)
    if flag in BOOL_FLAGS:
        group.add_argument(
            *names,
            dest=_dest(flag),
            nargs="?",
            const="true",
            default=argparse.SUPPRESS,
            metavar="BOOL",
            help=help_text or _described(flag),
        )
    else:
        group.add_argument(
            *names, dest=_dest(flag), default=argparse.SUPPRESS,
            metavar=metavar or _METAVARS.get(flag, "VALUE"), help=help_text or _described(flag),
        )


def _described(flag: str) -> str:
    """The flag's help, with its environment variable where ENV_RULE does not name it."""
    variables = [name for name, path in ENV_VARS.items() if path == FLAG_PATHS[flag]]
    return _HELP[flag] if env_name(flag) in variables else f"{_HELP[flag]} (env {variables[0]})"


def overrides_from_args(ns: argparse.Namespace) -> dict[str, object]:
    """Config path -> value, for the flags actually given on the command line."""
    given = vars(ns)
    return {path: given[_dest(flag)] for flag, path in FLAG_PATHS.items() if _dest(flag) in given}
