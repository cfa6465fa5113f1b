"""`nvdp cdi generate`: print or write exactly the CDI specs the plugin would write on this node.

It goes the plugin's way: the config from `--config` (else CONFIG_FILE), the environment and the
plugin's CDI flags (loaded as the plugin loads them), the GPUs through NVML, the plan, then
`nvdp.cdi.generate`. Run it in the plugin pod (`kubectl exec <pod> -- nvdp cdi
generate`) to see what the plugin writes, or on a host as `nvidia-ctk cdi generate --driver-root R
--dev-root D` is run: where the container driver root (/driver-root in the plugin's pod) does not
exist, the driver's files and NVML are read where `--driver-root` points, and the device nodes under
`--dev-root` (when given).

`--output -` (the default) prints each spec as compact JSON, one per line (the `gpu` spec first);
`--output DIR` writes them into a directory as the plugin does (its file names, atomically, 0644);
`--output FILE` writes the one spec there is to FILE, atomically. What was written, or left as it was,
is said on stderr. Every error is one line naming the cause and the fix, exit status 1; usage errors
exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvdp.config.flags import add_config_flag, add_config_option

if TYPE_CHECKING:
    from nvdp.cdi.build import SpecSet
    from nvdp.config.model import Config

EXIT_FAILED = 1
EXIT_USAGE = 2


class GenerateError(Exception):
    """The specs cannot be generated or written; the message is the one line to print."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "cdi",
        help="CDI specs: `nvdp cdi generate` prints what the plugin writes to /var/run/cdi",
        description="CDI specs of the device plugin (cdi-annotations / cdi-cri device list strategies).",
    )
    commands = parser.add_subparsers(dest="cdi_command", required=True, metavar="COMMAND")
    generate = commands.add_parser(
        "generate",
        help="print or write the CDI specs the plugin would write on this node",
        description="Generate the CDI specs the plugin writes with a CDI device list strategy, from this "
        "node's GPUs (NVML) and driver files, under the config and environment the plugin would use.",
    )
    add_config_option(generate, "the plugin's config file (default: env CONFIG_FILE, else the built-in "
                      "defaults)")
    roots = generate.add_argument_group("the plugin's CDI settings (flag > environment > config file)")
    add_config_flag(roots, "--driver-root", metavar="DIR", help_text="host path of the driver root, "
                    "written into the spec (flags.nvidiaDriverRoot, env NVIDIA_DRIVER_ROOT); on a host, "
                    "also where the driver's files are read (as nvidia-ctk reads them)")
    add_config_flag(roots, "--dev-root", metavar="DIR", help_text="host root of dev/nvidia*, written into "
                    "the spec (flags.nvidiaDevRoot, env NVIDIA_DEV_ROOT; default: the driver root); on a "
                    "host, also where the device nodes are read (as nvidia-ctk reads them)")
    add_config_flag(roots, "--driver-root-ctr-path", first="--container-driver-root", metavar="DIR",
                    help_text="where the driver root is seen here (flags.plugin.containerDriverRoot, env "
                    "DRIVER_ROOT_CTR_PATH; default /driver-root, the plugin pod's mount; where that does "
                    "not exist, the driver root)")
    for flag in ("--nvidia-cdi-hook-path", "--cdi-disable-hooks", "--cdi-feature-flags"):
        add_config_flag(roots, flag)
    generate.add_argument("--output", metavar="FILE|DIR|-", default="-", help="- prints the specs, one JSON "
                          "document a line (default); a directory gets the plugin's spec files; a file "
                          "gets the one spec (atomically)")
    generate.set_defaults(handler=generate_command)


# The path flags, by destination: each must be absolute.
_PATH_FLAGS = {"driver_root": "--driver-root", "dev_root": "--dev-root",
               "driver_root_ctr_path": "--container-driver-root"}


def _relative_path(args: argparse.Namespace) -> str | None:
    for dest, flag in _PATH_FLAGS.items():
        text = getattr(args, dest, None)
        if text is not None and not text.startswith("/"):
            return f"{flag}: {text!r} is not an absolute path; a path such as / or /run/nvidia/driver"
    return None


def generate_command(args: argparse.Namespace) -> int:
    problem = _relative_path(args)
    if problem is not None:
        print(f"nvdp cdi generate: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        specs = generate_specs(args, os.environ)
        output(specs, args.output)
    except GenerateError as err:
        print(f"nvdp cdi generate: {err}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:  # a line to report, never a traceback
        print(f"nvdp cdi generate: unexpected error: {type(err).__name__}: {err}; report this line",
              file=sys.stderr)
        return EXIT_FAILED
    return 0


def load(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Config, str | None]:
    """The config as the plugin loads it: the file, the environment, and the plugin's flags given; and
    where the device nodes are read when not by the plugin's rule. On a host (no container driver
    root there), the container driver root is the driver root and the device nodes are read under the
    dev root given (flags.nvidiaDevRoot), as nvidia-ctk reads them: the files and nodes are read where
    the spec says they are."""
    from nvdp.config.flags import overrides_from_args
    from nvdp.config.loader import ConfigError, load_config
    from nvdp.config.sources import CONFIG_FILE_ENV

    path = args.config_file or env.get(CONFIG_FILE_ENV) or None
    if args.config_file and not Path(args.config_file).is_file():
        raise GenerateError(f"--config {args.config_file}: no such file; pass the plugin's config file (in "
                            "the plugin pod the file CONFIG_FILE names, or /available-configs/<entry>)")
    if path is None and env.get("CONFIG_DIR"):
        raise GenerateError(
            f"CONFIG_DIR is set ({env['CONFIG_DIR']}): the plugin chooses an entry there by the node's "
            "label; pass the entry it uses with --config (its log says `Config in force: <entry>`), e.g. "
            f"--config {env['CONFIG_DIR'].rstrip('/')}/<entry>"
        )
    overrides = overrides_from_args(args)
    try:
        config = load_config(path, env, overrides, path_flag="--config")
        host_root = _host_driver_root(config)
        if host_root is not None:
            config = load_config(path, env, {**overrides, "flags.plugin.containerDriverRoot": host_root},
                                 path_flag="--config")
    except ConfigError as err:
        raise GenerateError(" ".join(str(err).split())) from None
    return config, (config.flags.nvidia_dev_root or None) if host_root is not None else None


def _host_driver_root(config: Config) -> str | None:
    """The driver root, when this is a host rather than the plugin's pod: the container driver root
    does not exist here and the driver root is a folder (as nvidia-ctk, which reads the files where
    --driver-root points). None: the container driver root applies, as in the plugin."""
    driver_root = config.flags.nvidia_driver_root or "/"
    if os.path.lexists(config.flags.plugin.container_driver_root) or not os.path.isdir(driver_root):
        return None
    return driver_root


def generate_specs(args: argparse.Namespace, env: Mapping[str, str]) -> SpecSet:
    """The SpecSet the plugin would write, or GenerateError with the cause and the fix: the functions
    the plugin's prepare calls (NVML discovery, the plan, `nvdp.cdi.generate`) on the config it loads."""
    from nvdp.cdi import generate
    from nvdp.cdi.errors import CdiError
    from nvdp.inventory.nvml import NvmlUnavailable, discover
    from nvdp.plan import PlanError, plan

    config, dev_root = load(args, env)
    _warn_unknown_feature_flags(config)
    flags = config.flags
    try:
        inventory = discover(flags.nvidia_driver_root, flags.plugin.container_driver_root)
    except NvmlUnavailable as err:
        raise GenerateError(" ".join(str(err).split())) from None
    try:
        planned = plan(config, inventory)
    except PlanError as err:
        raise GenerateError(f"the configuration cannot be applied to this node's GPUs: {err}") from None
    try:
        return generate(config, inventory, planned, dev_root=dev_root)
    except CdiError as err:
        raise GenerateError(" ".join(str(err).split())) from None


def _warn_unknown_feature_flags(config: Config) -> None:
    from nvdp.config.model import KNOWN_CDI_FEATURE_FLAGS

    unknown = [f for f in config.flags.plugin.cdi_feature_flags if f not in KNOWN_CDI_FEATURE_FLAGS]
    if unknown:
        known = ", ".join(KNOWN_CDI_FEATURE_FLAGS)
        print(f"nvdp cdi generate: warning: unknown CDI feature flag(s) {', '.join(unknown)}, ignored as "
              f"NVIDIA ignores them; the known ones are {known}", file=sys.stderr)


def output(specs: SpecSet, where: str) -> None:
    from nvdp.cdi.spec import encode

    if where == "-":
        for spec in specs.specs:
            sys.stdout.write(encode(spec).decode() + "\n")
        return
    if Path(where).is_dir():
        _write_dir(specs, where)
        return
    if len(specs.specs) != 1:
        kinds = ", ".join(spec.kind for spec in specs.specs)
        raise GenerateError(
            f"--output {where}: this node has {len(specs.specs)} specs ({kinds}), a file holds one; pass a "
            "directory to write each as the plugin does, or - to print them"
        )
    _write_file(encode(specs.specs[0]), where)


def _write_dir(specs: SpecSet, directory: str) -> None:
    from nvdp.cdi.errors import CdiError
    from nvdp.cdi.write import write_specs

    try:
        result = write_specs(specs, directory)
    except CdiError as err:
        raise GenerateError(" ".join(str(err).split())) from None
    for path in result.written:
        print(f"written: {path}", file=sys.stderr)
    for path in result.unchanged:
        print(f"unchanged: {path}", file=sys.stderr)


def _write_file(data: bytes, path: str) -> None:
    from nvdp.cdi.errors import CdiError
    from nvdp.cdi.write import write_file

    try:
        written = write_file(data, path)
    except CdiError as err:
        raise GenerateError(" ".join(str(err).split())) from None
    print(f"{'written' if written else 'unchanged'}: {path}", file=sys.stderr)
