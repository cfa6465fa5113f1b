"""The MPS control daemon's own work on the daemon skeleton: the chosen config's daemons, in force.

`switch` (the per-node rule's, nvdp.daemon.pernode.nodechoice) loads the config, checks the mode switch,
plans the
MPS resources and restarts the daemons when the entry or its content changed; `finish` is the final
stop (compute modes back to DEFAULT, host state cleaned up).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from nvdp.daemon.api import PODS_UNREADABLE
from nvdp.daemon.errors import CannotGoOn
from nvdp.daemon.pernode.mode import ModeGate, driver_name, follower_mode
from nvdp.daemon.pernode.nodeconfig import Chosen, NodeConfigSettings
from nvdp.daemon.podresources import kubelet_pods_from
from nvdp.daemon.runloop import Wakes
from nvdp.daemon.skeleton import DaemonWork, Skeleton
from nvdp.mps.commands import MpsConfigError, MpsSettings
from nvdp.mps.compute_mode import ComputeModeError, ComputeModes, NvmlComputeModes
from nvdp.mps.daemons import Daemons, plan_mps
from nvdp.mps.node.handover import HOLDER_FILE, Handover, Users, read_holder
from nvdp.mps.node.host_setup import clean_up
from nvdp.mps.paths import ResourcePaths, unusable_root, unusable_root_message

if TYPE_CHECKING:
    from nvdp.daemon.pernode.mode import KubeletPods, NodeApi

# How often a pod waiting for its turn on the node asks again (nvdp.mps.node.handover).
HANDOVER_POLL_S = 1.0


def pods_using(resources: set[str], kubelet_pods: KubeletPods | None) -> Users:
    """The pods the kubelet runs that were given devices of `resources` (`namespace/name`)."""
    if kubelet_pods is None:
        return Users(unknown="the kubelet's pod-resources socket is not mounted "
                     "(KUBELET_POD_RESOURCES_SOCKET is not set)")
    try:
        pods = kubelet_pods()
    except Exception as err:  # the client's PodResourcesUnavailable, whose message has the fix
        return Users(unknown=str(err))
    return Users(names=tuple(sorted(f"{p.namespace}/{p.name}" for p in pods if resources & set(p.resources))))


def load_settings(
    args: argparse.Namespace, chosen: Chosen | None = None, gate: ModeGate | None = None,
    env: Mapping[str, str] = os.environ,
) -> tuple[str, list[MpsSettings], Callable[[], ComputeModes]]:
    """Config source and MPS settings; raises the config, inventory, plan or MPS error as is, or the
    mode gate's ConfigRefused (a mode switch that must wait). No settings in DRA mode.

    `chosen`: the per-node entry (CONFIG_DIR mode), which replaces --config-file / CONFIG_FILE.
    """
    from nvdp.config.flags import overrides_from_args
    from nvdp.config.loader import entry_in_force, load_config
    from nvdp.inventory.nvml import discover

    path, config_env = entry_in_force(args.config_file, env, chosen.path if chosen is not None else None,
                                      per_node=chosen is not None)
    config = load_config(path, config_env, overrides_from_args(args))
    modes_factory = partial(NvmlComputeModes, config.flags.plugin.container_driver_root)
    mode = follower_mode(config, env)
    if gate is not None:
        gate.check(mode)
    if mode == "dra":
        source, settings = f"{config.source} (DRA mode: the DRA plugin runs MPS for its claims)", []
    else:
        inventory = discover(config.flags.nvidia_driver_root, config.flags.plugin.container_driver_root)
        source, settings = config.source, plan_mps(config, inventory)
    if gate is not None:
        gate.enter(mode)
    return source, settings, modes_factory


def start_errors() -> tuple[type[BaseException], ...]:
    from nvdp.config.loader import ConfigError
    from nvdp.config.select import SelectionError
    from nvdp.inventory.nvml import NvmlUnavailable
    from nvdp.plan import PlanError

    return (ConfigError, NvmlUnavailable, PlanError, MpsConfigError, ComputeModeError, SelectionError)


def root_problem(root: Path, settings: Sequence[MpsSettings]) -> str | None:
    """Why no daemon could work under `root`, checked before any GPU's compute mode is touched."""
    for item in settings:
        problem = unusable_root(root, ResourcePaths(root, item.resource_name).base)
        if problem is not None:
            return unusable_root_message(root, problem)
    return None


class CannotStart(CannotGoOn):
    """The daemons cannot run on this node whatever the config (the MPS root, a compute mode)."""

    prefix = "cannot start: "


class MpsDaemonWork(DaemonWork):
    """Puts the chosen config's daemons in force (the `switch` of nvdp.daemon.pernode.nodechoice) and stops
    them.

    The node's mode: the plugins record its Events, this daemon only logs (nvdp.daemon.pernode.mode).
    """

    def __init__(self, skeleton: Skeleton, args: argparse.Namespace, root: Path, probe_interval: float,
                 settings: NodeConfigSettings | None) -> None:
        self.skeleton = skeleton
        self.log = skeleton.log
        self.args = args
        self.root = root
        self.probe_interval = probe_interval
        self.settings = settings
        self.current: Daemons | None = None
        # Loaded settings not in force yet: this pod waits for its turn on the node (nvdp.mps.node.handover).
        self.pending: tuple[str, list[MpsSettings], Callable[[], ComputeModes]] | None = None
        self.handover = Handover.from_env(root, self._users, self.log)

    def mode_api(self) -> NodeApi | None:
        """The pods on this node: with per-node config only, where the mode can change while it runs."""
        settings = self.settings
        if settings is None or not settings.node_name:
            return None
        return self.skeleton.api.node_api(settings.node_name, driver_name(self.skeleton.env), self.log,
                                          unreachable=PODS_UNREADABLE,
                                          kubelet_pods=kubelet_pods_from(self.skeleton.env))

    def switch(self, chosen: Chosen | None) -> None:
        from nvdp.daemon.pernode.nodechoice import ConfigRefused

        log = self.log
        if chosen is not None:
            log.info("per-node config: %s", chosen.describe())
        try:
            loaded = load_settings(self.args, chosen, self.skeleton.gate, self.skeleton.env)
        except start_errors() as err:
            raise ConfigRefused(str(err)) from None
        unusable = root_problem(self.root, loaded[1])
        if unusable is not None and self.current is None:
            # Exit so the pod shows the failure (CrashLoopBackOff) instead of looking Running.
            raise CannotStart(unusable)
        self.pending = loaded
        self._take_turn()

    def step(self, wakes: Wakes) -> int | None:
        if self.pending is not None:
            self._take_turn()
        return None

    def wake_after(self) -> float | None:
        # While another pod of this node runs the daemons: ask again for our turn, and who uses MPS.
        return HANDOVER_POLL_S if self.pending is not None else None

    def _take_turn(self) -> None:
        """Put the pending settings in force once this pod holds the node (nvdp.mps.node.handover)."""
        if self.pending is None or not self.handover.take():
            return
        source, settings, modes_factory = self.pending
        self.pending = None
        log = self.log
        if self.current is not None:
            log.info("reloading: stopping the running MPS daemons")
            self.current.stop()
        log.info("config: %s", source)
        self.handover.record_resources(tuple(item.resource_name for item in settings))
        self.current = Daemons(settings, self.root, modes_factory, log, self.probe_interval,
                               recorder=self.skeleton.recorder)
        if not settings:
            log.info("no resource is shared with MPS in %s; nothing to do", source)
        for item in settings:
            log.info("resource %s", item.describe())
        try:
            self.current.start()
        except ComputeModeError as err:
            raise CannotStart(str(err)) from None

    def _users(self) -> Users:
        """The pods on this node given devices of a resource the holder serves with MPS."""
        holder = read_holder(self.root)
        if holder is None:
            return Users(unknown=f"{self.root / HOLDER_FILE} (the running MPS daemon pod's resources) cannot "
                         "be read")
        return pods_using(set(holder.resources), kubelet_pods_from(self.skeleton.env))

    def start_failed(self, err: Exception) -> int | None:
        from nvdp.config.select import SelectionError
        from nvdp.daemon.pernode.nodechoice import ConfigRefused

        if not isinstance(err, (ConfigRefused, SelectionError)):
            raise err
        self.log.error("cannot start: %s", err)
        return 1

    def finish(self, code: int) -> int:
        """The final stop: daemons down, compute modes back to DEFAULT, host state cleaned up, unless a
        new pod of this node waits to take over: it shares that state (nvdp.mps.node.handover)."""
        if code != 0:
            self.handover.close()
            return code
        self.log.info("stopping")
        stopping, self.current = self.current, None
        restored = stopping.stop() if stopping is not None else True
        successor = self.handover.successor_waiting()
        if successor:
            self.log.info("a new MPS daemon pod waits to take over: the MPS tmpfs and folders stay")
        elif stopping is not None:
            clean_up(stopping.settings, self.root)
        self.handover.close(last=not successor)
        if not restored:
            self.log.error("stopped, but a GPU's compute mode could not be restored to DEFAULT (see above)")
            return 1
        return 0

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
