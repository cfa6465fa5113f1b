"""The device plugin's own work on the daemon skeleton: prepare a config, serve it, re-plan it.

`switch` (the per-node rule's, nvdp.daemon.pernode.nodechoice) prepares the config, the GPUs, the plan and
the CDI
specs (nvdp.plugin.prepare), then serves them (the first time: a PluginManager, the kubelet watcher
and the health monitor) or applies them to what runs (a re-plan: unchanged resources keep their
servers). A config that cannot be applied is refused and the previous one keeps serving.

In DRA mode the plugin serves nothing. Entering device-plugin mode beside a DRA plugin, the prepared
config is held back until the DRA plugin's ResourceSlices for the node are gone (nvdp.daemon.handover).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nvdp.config.model import Mode
from nvdp.daemon.handover import ModeHandover
from nvdp.daemon.healthwatch import HealthWatch
from nvdp.daemon.runloop import EXIT_FAILED, Wakes
from nvdp.daemon.skeleton import DaemonWork, Skeleton
from nvdp.plugin.cdi_specs import CdiSpecs, classes, spec_dir
from nvdp.plugin.heap import settle_heap
from nvdp.plugin.logs import log_inventory, log_plan
from nvdp.plugin.prepare import NvmlMissing, Prepared, StartupError, idle, load_config, prepare

if TYPE_CHECKING:
    from nvdp.config.model import Config
    from nvdp.daemon.pernode.mode import ModeGate, NodeApi
    from nvdp.daemon.pernode.nodeconfig import Chosen
    from nvdp.health.ledger import Change
    from nvdp.plugin.kubelet_watch import KubeletSocketWatcher
    from nvdp.plugin.manager import PluginManager

# How long the first health start waits for the resources' first registration attempts (an MPS gate
# may hold a resource back for much longer; health checking does not wait for that).
HEALTH_AFTER_REGISTERING_S = 1.0
WAITING_FOR_DRA = "waiting for the DRA plugin to delete this node's ResourceSlices"


class DevicePluginWork(DaemonWork):
    """The config served, its PluginManager, the kubelet watcher and the health monitor."""

    own_mode: Mode | None = "device-plugin"

    def __init__(self, skeleton: Skeleton, args: argparse.Namespace) -> None:
        self.skeleton = skeleton
        self.args = args
        self.env = skeleton.env
        self.log = skeleton.log
        self.recorder = skeleton.recorder
        self.manager: PluginManager | None = None
        self.watcher: KubeletSocketWatcher | None = None
        self.health = HealthWatch(self.log, self.recorder, "nvidia-device-plugin")
        # Why the plugin does not serve yet, for /readyz; None once it serves (or knowingly serves nothing).
        self.not_serving_reason: str | None = "starting"
        # The node's mode and, while the DRA plugin still publishes, the config held back.
        self.mode: ModeHandover | None = None
        self.held: Prepared | None = None
        self.specs = CdiSpecs(spec_dir(self.env), self.log)
        self._why = "Received SIGHUP"
        self._first = True  # the start's switch: a failure is the start's, not a refused reload

    # --- putting a config in force (the `switch` of nvdp.daemon.pernode.nodechoice)
    # ----------------------------

    def prepare(self, chosen: Chosen | None) -> Prepared:
        """Config, mode, GPUs, plan and CDI specs; raises StartupError / NvmlMissing, or the mode gate's
        ConfigRefused (a mode switch that may not happen now), changing nothing."""
        from nvdp.daemon.pernode.mode import follower_mode

        path = chosen.path if chosen is not None else None
        config = load_config(self.args, self.env, path, per_node=self.skeleton.node_config is not None)
        self.log.info("Configuration from %s%s", config.source, f", {chosen.describe()}" if chosen else "")
        mode = follower_mode(config, self.env)
        self.gate().check(mode)
        if mode == "dra":  # the DRA plugin serves this node's GPUs: read nothing, advertise nothing
            return idle(config, mode, "this node is in DRA mode: the DRA plugin serves its GPUs")
        return prepare(config)

    def switch(self, chosen: Chosen | None) -> None:
        if self._first:
            self.start_with(chosen)
        else:
            self.reload(chosen)

    def start_with(self, chosen: Chosen | None) -> None:
        """The first config: serve it, or raise ConfigRefused (invalid) / NvmlMissing as they are."""
        from nvdp.daemon.pernode.nodechoice import ConfigRefused

        try:
            prepared = self.prepare(chosen)
            self.specs.stage(prepared.cdi)  # before any resource registers, held back or not
        except StartupError as err:
            raise ConfigRefused(str(err)) from None
        self.record_active(prepared, chosen)
        self.serve(self.hold(prepared, entering=True))

    def reload(self, chosen: Chosen | None) -> None:
        """Re-plan from a fresh config and GPU list; on any error raise ConfigRefused, serving as before."""
        from nvdp.daemon.pernode.nodechoice import ConfigRefused

        notify = self.skeleton.node_config is None  # per-node config reports InvalidConfig with the entry
        why = f"{self._why}; config {chosen.describe()}" if chosen is not None else self._why
        self.log.info("%s: reloading the configuration and re-reading the GPUs", why)
        try:
            prepared = self.prepare(chosen)
            self.specs.stage(prepared.cdi)  # the CDI specs first: a failure leaves everything as it was
        except ConfigRefused:
            raise  # a mode switch that waits (or needs a restart): nothing changed, the rule reports it
        except (StartupError, NvmlMissing) as err:
            self.recorder.config_refused(str(err), time.time(), notify=notify)
            raise ConfigRefused(str(err)) from None
        except Exception as err:  # whatever went wrong, a reload must not take a serving plugin down
            error = f"{type(err).__name__}: {err}"
            self.recorder.config_refused(error, time.time(), notify=notify)
            self.log.exception("Reload failed unexpectedly (%s); still serving the previous configuration",
                               error)
            raise ConfigRefused(error) from None
        prepared = self.hold(prepared, entering=None)
        self.record_active(prepared, chosen)
        if self.manager is None:
            self.recorder.config_applied(prepared.config.source, "first configuration served", True,
                                         time.time(), notify=notify)
            self.serve(prepared)
        else:
            self.apply(prepared, notify)
        if prepared.idle is None:
            self.gate().advertising()

    def hold(self, prepared: Prepared, *, entering: bool | None) -> Prepared:
        """`prepared`'s mode goes in force; what to serve now: `prepared`, or nothing while the DRA
        plugin still publishes this node's GPUs (`prepared` is then held until its slices are gone)."""
        waiting = self.mode_handover().enter(prepared.mode, entering=entering)
        self.held = prepared if waiting else None
        return idle(prepared.config, prepared.mode, WAITING_FOR_DRA) if waiting else prepared

    def release_held(self) -> None:
        """The DRA plugin let go: serve the held config."""
        held, self.held = self.held, None
        assert held is not None
        if self.manager is None:
            self.serve(held)
        else:
            self.apply(held, notify=False)
        self.gate().advertising()

    def apply(self, prepared: Prepared, notify: bool) -> None:
        assert self.manager is not None
        log_plan(self.log, prepared.plan)
        self.health.stop()
        diff = self.manager.apply(prepared.plan, prepared.config, prepared.inventory, classes(prepared.cdi))
        self.specs.settle(prepared.cdi)
        self.log.info("Reload applied: %s", diff.describe())
        changed = bool(diff.added or diff.removed or diff.changed or diff.restarted)
        self.recorder.config_applied(prepared.config.source, diff.describe(), changed, time.time(),
                                     notify=notify)
        self.watch_kubelet(prepared.config)
        if prepared.idle is None:
            self.start_health(prepared)
        self.log_idle(prepared)
        settle_heap(collect=True)

    def log_idle(self, prepared: Prepared) -> None:
        if prepared.idle is not None:
            self.log.info("Advertising nothing: %s.", prepared.idle)
        elif not prepared.plan.resources:
            self.log.info("No devices found. Waiting indefinitely.")

    def record_active(self, prepared: Prepared, chosen: Chosen | None) -> None:
        """The config going in force, for nvdp_config_active. Set before any resource registers, so a
        scrape that sees the resources also sees the config they come from."""
        entry = (chosen.entry or "") if chosen is not None else ""
        self.recorder.config_active(prepared.config.source, entry)

    # --- serving -----------------------------------------------------------------------------

    def serve(self, prepared: Prepared) -> None:
        from nvdp.plugin.manager import PluginManager

        if prepared.idle is None:
            log_inventory(self.log, prepared.inventory)
        log_plan(self.log, prepared.plan)
        self.specs.stage(prepared.cdi)  # before any resource registers; raises StartupError
        self.manager = PluginManager(prepared.config, prepared.inventory, self.log, recorder=self.recorder)
        if prepared.idle is None:  # GPUs down before a restart are down from the first list on
            unhealthy = self.health.open_ledger(prepared.config).unhealthy
            self.manager.set_health(unhealthy, "as before the restart")
        self.watch_kubelet(prepared.config)
        self.manager.apply(prepared.plan, cdi_classes=classes(prepared.cdi))
        # Health checking starts once the resources have registered (or tried to), as in NVIDIA's
        # plugin: its set-up, NVML event registration for every GPU, would otherwise compete with
        # registering for the interpreter. Like an XID before start-up, one in those milliseconds
        # goes unseen (NVML keeps events only for event sets registered before them).
        self.manager.wait_first_attempts(HEALTH_AFTER_REGISTERING_S)
        if prepared.idle is None:
            self.start_health(prepared)
        self.not_serving_reason = None
        self.log_idle(prepared)
        settle_heap(collect=False)

    def watch_kubelet(self, config: Config) -> None:
        from nvdp.plugin.kubelet_watch import KubeletSocketWatcher

        path = config.flags.plugin.kubelet_socket_path
        if self.watcher is not None:
            if self.watcher.socket_path == path:
                return
            self.watcher.stop()
        manager = self.manager
        assert manager is not None

        def kubelet_restarted() -> None:
            self.recorder.kubelet_restart()
            manager.kubelet_restarted()

        self.watcher = KubeletSocketWatcher(path, kubelet_restarted, self.log)
        self.watcher.start()

    def start_health(self, prepared: Prepared) -> None:
        manager = self.manager
        assert manager is not None

        def on_health(unhealthy: frozenset[str], changes: Sequence[Change]) -> None:
            manager.set_health(unhealthy, "; ".join(sorted({c.reason for c in changes})))

        self.health.start(prepared.config, prepared.inventory, on_health)

    # --- the node's mode (nvdp.daemon.pernode.mode)
    # -------------------------------------------------------------

    def gate(self) -> ModeGate:
        gate = self.skeleton.gate
        assert gate is not None
        return gate

    def mode_handover(self) -> ModeHandover:
        """Entering device-plugin mode beside a DRA plugin, wait until its slices are gone."""
        if self.mode is None:
            self.mode = ModeHandover(self.gate(), slices_left, self.log)
        return self.mode

    def mode_api(self) -> NodeApi | None:
        """The API reads of the mode policy: with per-node config, or beside a DRA plugin (whose slices
        it waits for); None without a node name or API access. With KUBELET_POD_RESOURCES_SOCKET set
        (the kubelet's pod-resources socket mounted), the pods using the GPUs come from the kubelet
        rather than a list of the node's pods through the API server."""
        from nvdp.config.names import node_name
        from nvdp.daemon.pernode.mode import driver_name
        from nvdp.daemon.podresources import kubelet_pods_from

        driver, node = driver_name(self.env), node_name(self.env)
        if not node or (self.skeleton.node_config is None and driver is None):
            return None  # and no API client imported: a single-config plugin never talks to the API
        unreachable = None
        if driver is not None:
            unreachable = ("Cannot read the API server (%s): this node's ResourceSlices of driver "
                           + driver.replace("%", "%%") + " are not checked before advertising")
        return self.skeleton.api.node_api(node, driver, self.log, unreachable=unreachable,
                                          kubelet_pods=kubelet_pods_from(self.env))

    # --- the loop and the end --------------------------------------------------------------------

    def begin(self) -> int | None:
        self._first = False
        return None

    def start_failed(self, err: Exception) -> int | None:
        from nvdp.config.select import SelectionError
        from nvdp.daemon.pernode.nodechoice import ConfigRefused

        self._first = False
        if isinstance(err, (StartupError, ConfigRefused, SelectionError)):
            self.log.error("%s", err)
            return EXIT_FAILED
        if not isinstance(err, NvmlMissing):
            raise err
        if err.fail:
            self.log.error("%s", err)
            self.log.error("Exiting: failOnInitError is true (set it to false to keep the plugin running "
                           "without GPUs on this node)")
            return EXIT_FAILED
        self.log.warning("%s", err)
        self.log.warning("failOnInitError is false: serving nothing; send SIGHUP to retry")
        self.not_serving_reason = None
        self.log.info("No devices found. Waiting indefinitely.")
        return None

    def replanning(self, why: str, *, retry: bool) -> None:
        self._why = why

    def step(self, wakes: Wakes) -> int | None:
        if self.mode is not None and self.held is not None and self.mode.poll():
            self.release_held()
        return None

    def wake_after(self) -> float | None:
        """While waiting for the DRA plugin, look again soon."""
        from nvdp.daemon.pernode.mode import HANDOVER_POLL_S

        return HANDOVER_POLL_S if self.mode is not None and self.mode.waiting else None

    def stop(self) -> None:
        # Do not wait out the health thread's NVML wait: the process is about to exit anyway.
        self.health.stop(timeout=0)
        if self.watcher is not None:
            self.watcher.stop()
        if self.manager is not None:
            self.log.info("Stopping plugins.")
            self.manager.stop()


def slices_left(api: NodeApi) -> tuple[str, Callable[[], str | None]] | None:
    """What the device plugin waits for: the DRA plugin's ResourceSlices for the node to be gone."""
    if api.driver is None:
        return None

    def slices() -> str | None:
        left = api.slices_left()
        return f"{left} ResourceSlice(s) of driver {api.driver} for node {api.node}" if left else None

    return "the DRA plugin to delete this node's ResourceSlices", slices

