"""`nvdp doctor`: check a GPU node (or the plugin pod) in order, PASS / FAIL with the fix for each."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvdp.config import names
from nvdp.doctor.bounded import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from nvdp.doctor.api import LabelRead

EXIT_FAILED = 1


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0, e.g. 10")
    return value


def register(sub: Any) -> None:
    from nvdp.config.flags import CONFIG_FLAG, add_config_arguments
    from nvdp.daemon.pernode.nodeconfig import add_node_config_arguments

    parser = sub.add_parser(
        "doctor",
        help="check this node or plugin pod: NVML, driver, GPUs, runtime, kubelet, config, CDI, MPS, MIG",
        description="Check, in order, what the plugin needs on this node and print PASS or FAIL with the "
        "fix for each. Run it in the plugin pod (`kubectl exec <plugin pod> -- nvdp doctor`) or on the "
        "node. Exit 0 when nothing failed, 1 otherwise.",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--context",
        choices=("auto", "container", "host"),
        default="auto",
        help="where this runs: in the plugin's container or on the node (default: detected)",
    )
    parser.add_argument(
        "--check-timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="how long one check may wait for NVML, the API server or a socket (default %(default)s)",
    )
    parser.add_argument("--sysfs-root", default="/sys", metavar="PATH", help="sysfs to read PCI devices from")
    add_node_config_arguments(parser)
    add_config_arguments(parser, file_flag=CONFIG_FLAG, listed=False)
    parser.set_defaults(handler=doctor_command)


class LabelReader:
    """Reads the node's labels once, on first use, within the check time limit."""

    def __init__(self, node: str, kubeconfig: str | None, seconds: float) -> None:
        self.node, self.kubeconfig, self.seconds = node, kubeconfig, seconds
        self._read: LabelRead | None = None

    def __call__(self) -> LabelRead:
        if self._read is None:
            from nvdp.doctor.api import read_node_labels

            self._read = read_node_labels(self.node, self.kubeconfig, self.seconds)
        return self._read


def choose_entry(
    args: argparse.Namespace, env: Mapping[str, str], labels: LabelReader
) -> tuple[str | None, str, LabelRead] | None:
    """Per-node config (CONFIG_DIR): the entry this node gets, as the plugin chooses it; None otherwise.

    Raises SelectionError when no entry can be chosen.
    """
    from nvdp.config.entries import entry_path, list_entries
    from nvdp.config.select import SelectionError, select_for_labels
    from nvdp.daemon.pernode.nodeconfig import settings_from

    settings = settings_from(args, env)
    if settings is None:
        return None
    try:
        entries = list_entries(settings.config_dir)
    except OSError as err:
        raise SelectionError(
            f"cannot read the entries in {settings.config_dir}: {err.strerror or err}"
        ) from None
    if settings.node_name and settings.node_name != labels.node:
        labels = LabelReader(settings.node_name, settings.kubeconfig, labels.seconds)
    read = labels()
    selection = select_for_labels(
        entries, read.labels, settings.default, settings.fallbacks, settings.label_name
    )
    path = str(entry_path(settings.config_dir, selection.entry)) if selection.entry is not None else None
    unread = (
        ""
        if read.labels is not None
        else f"; the node label {settings.label_name} could not be read ({read.problem})"
    )
    return path, f"{selection.describe()}{unread}", read


def doctor_command(args: argparse.Namespace) -> int:
    from nvdp.config.flags import overrides_from_args
    from nvdp.config.issues import ConfigError
    from nvdp.config.loader import entry_in_force, load_config
    from nvdp.config.select import SelectionError
    from nvdp.doctor.checks import Doctor, Where, detect_context
    from nvdp.doctor.report import as_json, as_text, healthy

    env: Mapping[str, str] = os.environ
    node = names.node_name(env, getattr(args, "node_name", None))
    labels = LabelReader(node, getattr(args, "kubeconfig", None), args.check_timeout)
    path, chosen, read = args.config_file, "", None
    try:
        per_node = choose_entry(args, env, labels)
        if per_node is not None:
            entry, chosen, read = per_node
            path, env = entry_in_force(path, env, Path(entry) if entry else None, per_node=True)
        config, error = load_config(path, env, overrides_from_args(args), path_flag="--config"), None
    except ConfigError as err:
        config, error = None, str(err)
    except SelectionError as err:
        config, error = None, f"no config entry can be chosen for this node: {err}"
    except Exception as err:  # a report line, never a traceback
        config, error = None, f"the config could not be read: {type(err).__name__}: {err}"
    context = detect_context(env) if args.context == "auto" else args.context
    where = Where(
        env=env,
        context=context,
        sysfs=Path(args.sysfs_root),
        node_name=node,
        node_labels=labels,
        timeout=args.check_timeout,
    )
    doctor = Doctor(where, config, error, chosen, read)
    doctor.dra_kubeconfig = getattr(args, "kubeconfig", None)
    findings = doctor.run()
    sys.stdout.write(as_json(findings) if args.json else as_text(findings))
    return 0 if healthy(findings) else EXIT_FAILED
