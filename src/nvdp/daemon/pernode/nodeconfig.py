"""Per-node config: follow this node's `nvidia.com/device-plugin.config` label and the mounted entries.

The plugin and the MPS control daemon both use `NodeConfig`. It knows the entries directory (the
chart mounts the whole ConfigMap there), `config.default` and the fallback strategies, watches the
Node (nvdp.kube) and polls the directory for the kubelet's volume refresh. It never decides when to
reload: it calls `on_change()` and the owner re-chooses with `choose()` and re-plans through its
normal reload path. Problems a cluster admin must see (an unknown entry, an invalid one) are logged
and recorded as Events on the Node.
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec import Struct

from nvdp.config import names
from nvdp.config.entries import directory_fingerprint, entry_path, fingerprint, list_entries
from nvdp.config.select import (
    DEFAULT_FALLBACKS,
    NODE_CONFIG_LABEL,
    Selection,
    SelectionError,
    UnknownEntry,
    parse_fallbacks,
    select_entry,
)

if TYPE_CHECKING:
    from nvdp.daemon.report.recording import Recorder
    from nvdp.kube import NodeLabels, NodeWatcher

POLL_INTERVAL_S = 5.0


class NodeConfigSettings(Struct, frozen=True):
    config_dir: Path
    node_name: str | None = None
    default: str | None = None
    fallbacks: tuple[str, ...] = DEFAULT_FALLBACKS
    label_name: str = NODE_CONFIG_LABEL
    kubeconfig: str | None = None


def add_node_config_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("per-node config (an entry of a folder chosen by a node label)")
    # Each reads the variable named as the flag in capitals when not given (nvdp.config.flags.ENV_RULE).
    group.add_argument("--config-dir", metavar="DIR", help="folder of config entries, one file each")
    group.add_argument("--default-config", metavar="ENTRY", help="the entry of a node without the label")
    group.add_argument("--fallback-strategies", metavar="LIST",
                       help="named, single, empty (default named,single)")
    group.add_argument("--node-name", metavar="NAME", help="this node")
    group.add_argument("--node-label", metavar="KEY",
                       help=f"the label naming the entry ({NODE_CONFIG_LABEL})")
    group.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig outside a cluster")


def settings_from(args: argparse.Namespace, env: Mapping[str, str]) -> NodeConfigSettings | None:
    """The per-node settings, or None when no entries directory is configured (single-file mode)."""
    config_dir = getattr(args, "config_dir", None) or env.get("CONFIG_DIR") or None
    if not config_dir:
        return None
    return NodeConfigSettings(
        config_dir=Path(config_dir),
        node_name=names.node_name(env, getattr(args, "node_name", None)) or None,
        default=getattr(args, "default_config", None) or env.get("DEFAULT_CONFIG") or None,
        fallbacks=parse_fallbacks(getattr(args, "fallback_strategies", None)
                                  or env.get("FALLBACK_STRATEGIES")),
        label_name=getattr(args, "node_label", None) or env.get("NODE_LABEL") or NODE_CONFIG_LABEL,
        kubeconfig=getattr(args, "kubeconfig", None) or None,
    )


def follow(args: argparse.Namespace, env: Mapping[str, str], on_change: Callable[[], None],
           log: logging.Logger, **options: Any) -> NodeConfig | None:
    """Start following label and entries in CONFIG_DIR mode; None with a single config file.

    Raises SelectionError for settings that name no valid fallback strategy.
    """
    return follow_settings(settings_from(args, env), getattr(args, "config_file", None), on_change, log,
                           **options)


def follow_settings(settings: NodeConfigSettings | None, config_file: str | None,
                    on_change: Callable[[], None], log: logging.Logger, **options: Any) -> NodeConfig | None:
    """`follow` with the settings already read (None: a single config file, nothing to follow)."""
    if settings is None:
        return None
    if config_file:
        log.warning("--config-file is ignored: --config-dir (CONFIG_DIR) picks the config per node")
    node_config = NodeConfig(settings, on_change, log, **options)
    node_config.start()
    return node_config


class Chosen(Struct, frozen=True):
    """A selection resolved to a file and its content, so an edit of the same entry counts as a change."""

    selection: Selection
    path: Path | None
    digest: str

    @property
    def entry(self) -> str | None:
        return self.selection.entry

    def describe(self) -> str:
        return self.selection.describe()


class NodeConfig:
    def __init__(self, settings: NodeConfigSettings, on_change: Callable[[], None], log: logging.Logger, *,
                 poll_interval_s: float = POLL_INTERVAL_S, recorder: Recorder | None = None,
                 on_labels: Callable[[Mapping[str, str]], None] | None = None) -> None:
        self.settings = settings
        self._on_change = on_change
        self._log = log
        self._poll_interval_s = poll_interval_s
        # The process's one Recorder: Events of the per-node choice go through its one writer.
        self._recorder = recorder
        # Every label state of the Node, for owners that act on more than the config label (the
        # GPU labeller compares its labels with them): one watch serves both.
        self._on_labels = on_labels
        self._labels: Mapping[str, str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._watcher: NodeWatcher | None = None

    # --- following -----------------------------------------------------------------------------

    def start(self) -> None:
        """Read the label once (a few seconds at most), then follow label and directory in threads.

        Without NODE_NAME there is no label: selection uses config.default and the fallbacks only.
        An API server that cannot be reached delays nothing: the label arrives when it can be read.
        """
        if self.settings.node_name:
            self._start_watch(self.settings.node_name)
        else:
            self._log.warning("NODE_NAME is not set: the node label %s is not read; using config.default "
                              "and the fallback strategies", self.settings.label_name)
        self._poller = threading.Thread(target=self._poll, name="config-dir-poll", daemon=True)
        self._poller.start()

    def _start_watch(self, node_name: str) -> None:
        from nvdp.kube import KubeConnectError, NoApiAccess, NodeWatcher, connect

        try:
            watch_client = connect(self.settings.kubeconfig)
        except NoApiAccess as err:
            entries = list_entries(self.settings.config_dir)
            if len(entries) <= 1:
                # The chart's least-privilege install: one entry, so no API access is given.
                self._log.info("the node label %s is not followed: one config entry (%s) and no API access "
                               "(%s)", self.settings.label_name, entries[0] if entries else "none", err)
            else:
                self._log.error("cannot follow the node label %s: %s; using config.default and the fallback "
                                "strategies (the chart grants API access where several entries exist)",
                                self.settings.label_name, err)
            return
        except KubeConnectError as err:
            self._log.error("cannot follow the node label %s: %s; using config.default and the fallback "
                            "strategies", self.settings.label_name, err)
            return
        first = threading.Event()

        def on_labels(node: NodeLabels) -> None:
            if self._recorder is not None:
                self._recorder.node_seen(node.uid)
            with self._lock:
                previous, self._labels = self._labels, dict(node.labels)
            if self._on_labels is not None:
                self._on_labels(node.labels)
            if first.is_set():
                old = (previous or {}).get(self.settings.label_name)
                new = node.labels.get(self.settings.label_name)
                if old != new:
                    self._log.info("node label %s changed: %s -> %s", self.settings.label_name,
                                   old or "(unset)", new or "(unset)")
                    self._on_change()
            first.set()

        self._watcher = NodeWatcher(watch_client, node_name, on_labels)
        self._watcher.start()
        if not first.wait(5.0):
            self._log.warning("node %s: labels not read yet (API server slow or unreachable); starting with "
                              "config.default and the fallbacks, switching when the label arrives", node_name)
            first.set()

    def _poll(self) -> None:
        last = directory_fingerprint(self.settings.config_dir)
        while not self._stop.wait(self._poll_interval_s):
            now = directory_fingerprint(self.settings.config_dir)
            if now != last:
                last = now
                self._log.info("config entries in %s changed (ConfigMap updated)", self.settings.config_dir)
                self._on_change()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.stop()
        if self._poller is not None:
            self._poller.join(2.0)

    # --- choosing ------------------------------------------------------------------------------

    @property
    def labels(self) -> Mapping[str, str] | None:
        with self._lock:
            return self._labels

    @property
    def label_value(self) -> str | None:
        labels = self.labels
        return labels.get(self.settings.label_name) if labels is not None else None

    def choose(self, *, lenient: bool = False) -> Chosen:
        """The entry this node should run now; raises SelectionError (with entries and fix).

        `lenient` (start-up, when nothing runs yet): a label naming a missing entry is reported and
        the node starts on what it would get without the label, rather than not at all.
        """
        s = self.settings
        try:
            entries = list_entries(s.config_dir)
        except OSError as err:
            raise SelectionError(f"cannot read the config entries in {s.config_dir}: "
                                 f"{err.strerror or err}; check the ConfigMap volume mount") from None
        try:
            selection = select_entry(entries, self.label_value, s.default, s.fallbacks, s.label_name)
        except UnknownEntry as err:
            if not lenient or not self.label_value or err.name != self.label_value:
                raise
            self.report("UnknownConfig", f"{err}; starting without it")
            selection = select_entry(entries, None, s.default, s.fallbacks, s.label_name)
        return self._chosen(selection)

    def without_label(self) -> Chosen:
        s = self.settings
        entries = list_entries(s.config_dir)
        return self._chosen(select_entry(entries, None, s.default, s.fallbacks, s.label_name))

    def _chosen(self, selection: Selection) -> Chosen:
        entry = selection.entry
        path = entry_path(self.settings.config_dir, entry) if entry is not None else None
        return Chosen(selection, path, fingerprint(path))

    # --- telling the admin ---------------------------------------------------------------------

    def report(self, reason: str, message: str, *, warning: bool = True) -> None:
        """Log, and record an Event on the Node (deduplicated and rate limited by the recorder)."""
        (self._log.warning if warning else self._log.info)("%s: %s", reason, message)
        if self._recorder is not None:
            self._recorder.event(reason, message, warning=warning)
