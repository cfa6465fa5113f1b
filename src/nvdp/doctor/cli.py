"""`nvdp doctor`: check a GPU node (or the plugin pod) in order, PASS / FAIL with the fix for each."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EXIT_FAILED = 1


def register(sub: Any) -> None:
    from nvdp.config.flags import add_config_arguments
    from nvdp.nodeconfig import add_node_config_arguments

    parser = sub.add_parser(
        "doctor",
        help="check this node or plugin pod: NVML, driver, GPUs, runtime, kubelet, config, MPS, MIG",
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
    parser.add_argument("--sysfs-root", default="/sys", metavar="PATH", help="sysfs to read PCI devices from")
    add_config_arguments(parser)
    add_node_config_arguments(parser)
    parser.set_defaults(handler=doctor_command)


def node_labels(node: str, kubeconfig: str | None = None) -> Mapping[str, str] | None:
    """The node's labels from the API, or None without access (no config, forbidden, unreachable)."""
    if not node:
        return None
    try:
        import httpx2
        from lightkube.core.exceptions import ApiError

        from nvdp.kube import KubeConnectError, connect, get_node_labels

        return get_node_labels(connect(kubeconfig), node).labels
    except (ImportError, KubeConnectError, ApiError, httpx2.HTTPError):
        return None


def choose_entry(
    args: argparse.Namespace, env: Mapping[str, str], node: str
) -> tuple[str | None, str] | None:
    """Per-node config (CONFIG_DIR): the entry this node gets, as the plugin chooses it; None otherwise.

    Raises SelectionError when no entry can be chosen.
    """
    from nvdp.config.entries import entry_path, list_entries
    from nvdp.config.select import SelectionError, select_for_labels
    from nvdp.nodeconfig import settings_from

    settings = settings_from(args, env)
    if settings is None:
        return None
    try:
        entries = list_entries(settings.config_dir)
    except OSError as err:
        raise SelectionError(
            f"cannot read the entries in {settings.config_dir}: {err.strerror or err}"
        ) from None
    labels = node_labels(settings.node_name or node, settings.kubeconfig)
    selection = select_for_labels(entries, labels, settings.default, settings.fallbacks, settings.label_name)
    path = str(entry_path(settings.config_dir, selection.entry)) if selection.entry is not None else None
    unread = (
        ""
        if labels is not None
        else f"; the node label {settings.label_name} could not be read (no API access)"
    )
    return path, f"{selection.describe()}{unread}"


def doctor_command(args: argparse.Namespace) -> int:
    from nvdp.config.flags import overrides_from_args
    from nvdp.config.issues import ConfigError
    from nvdp.config.loader import load_config
    from nvdp.config.select import SelectionError
    from nvdp.doctor.checks import Doctor, Where, detect_context
    from nvdp.doctor.report import as_json, as_text, healthy

    env: Mapping[str, str] = os.environ
    node = getattr(args, "node_name", None) or env.get("NODE_NAME", "")
    path, chosen = args.config_file, ""
    try:
        per_node = choose_entry(args, env, node)
        if per_node is not None:
            path, chosen = per_node
            env = {k: v for k, v in env.items() if k != "CONFIG_FILE"}  # as the plugin does in this mode
        config, error = load_config(path, env, overrides_from_args(args)), None
    except ConfigError as err:
        config, error = None, str(err)
    except SelectionError as err:
        config, error = None, f"no config entry can be chosen for this node: {err}"
    context = detect_context(env) if args.context == "auto" else args.context
    where = Where(
        env=env,
        context=context,
        sysfs=Path(args.sysfs_root),
        node_name=node,
        node_labels=lambda: node_labels(node, getattr(args, "kubeconfig", None)),
    )
    findings = Doctor(where, config, error, chosen).run()
    sys.stdout.write(as_json(findings) if args.json else as_text(findings))
    return 0 if healthy(findings) else EXIT_FAILED
