"""`nvidia-dra-plugin`: this node's GPUs as `resource.k8s.io/v1` devices, claims prepared through CDI.

The DRA kubelet plugin, on the run loop and per-node config rule every nvdp daemon shares. It reads
the same config, GPUs and CDI driver facts as the device plugin, publishes this node's pool as
ResourceSlices (written only when the devices or their health change), registers with the kubelet
through its plugin watcher, and answers NodePrepareResources / NodeUnprepareResources from the claims'
allocations, one CDI spec per claim, with a checkpoint of what it prepared.

Exit status: 0 after SIGTERM/SIGINT/SIGQUIT; 1 when it cannot start (invalid config, no GPUs' NVML, CDI
facts that cannot be read, no API server access, a driver name the kubelet would refuse), with the cause
and the fix in the log; 2 for command-line usage errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgspec import Struct

from nvdp import __version__
from nvdp.config.model import Config
from nvdp.config.names import DRA_DRIVER_ENV, node_name
from nvdp.dra.devices import DraDevice
from nvdp.dra.names import DEFAULT_DRIVER, check_driver_name
from nvdp.dra.taints import DeviceHealth, InformationalXids, slice_taints
from nvdp.inventory.model import Inventory
from nvdp.plugin.errors import NvmlMissing, StartupError
from nvdp.recording import Recorder
from nvdp.runloop import EXIT_FAILED, EXIT_USAGE, Inbox, Wake, Wakes, run

if TYPE_CHECKING:
    from nvdp.cdi.spec import ContainerEdits
    from nvdp.dra.cdi_specs import ClaimSpecWriter
    from nvdp.dra.health_service import HealthFeed
    from nvdp.dra.mps import ClaimMps
    from nvdp.dra.publish import SlicePublisher
    from nvdp.dra.server import DraServer
    from nvdp.dra.sharing import NodeSharing
    from nvdp.dra.state import ClaimPreparer, NodeView
    from nvdp.endpoints import HttpEndpoints, Response
    from nvdp.health.ledger import Change, Ledger
    from nvdp.mode import Handover, Mode, ModeGate
    from nvdp.nodechoice import NodeConfigRule
    from nvdp.nodeconfig import Chosen, NodeConfig
    from nvdp.plugin.health import HealthMonitor

DRIVER_ENV = DRA_DRIVER_ENV
PLUGINS_DIR_ENV = "KUBELET_PLUGINS_DIR"
REGISTRAR_DIR_ENV = "KUBELET_REGISTRAR_DIR"
CDI_ROOT_ENV = "CDI_ROOT"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_ROOT = "/var/run/cdi"
CHECKPOINT_FILE = "checkpoint.json"
LOCK_FILE = "pu.lock"
# The loop wakes this often to check that its sockets are still there (a kubelet's clean-up, or an
# operator, may remove them; the plugin watcher then forgets the driver until they are back).
TICK_S = 1.0
# A publish that failed (API server away, a conflict that kept coming back) is tried again this often;
# the slice watch also re-publishes when it reconnects.
REPUBLISH_AFTER_S = 10.0


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    from nvdp.config.flags import add_config_arguments
    from nvdp.nodeconfig import add_node_config_arguments
    from nvdp.plugin import observe

    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        prog="nvidia-dra-plugin",
        description="Publish this node's NVIDIA GPUs as resource.k8s.io/v1 devices and prepare the "
                    "ResourceClaims allocated to them (a kubelet DRA plugin).",
    )
    parser.add_argument("--version", action="version", version=f"nvidia-dra-plugin {__version__}")
    add_config_arguments(parser)
    observe.add_arguments(parser, env)
    add_node_config_arguments(parser)
    group = parser.add_argument_group("DRA")
    group.add_argument("--driver-name", default=env.get(DRIVER_ENV) or DEFAULT_DRIVER,
                       help=f"the DRA driver name (env {DRIVER_ENV}; default %(default)s)")
    group.add_argument("--kubelet-plugins-dir", default=env.get(PLUGINS_DIR_ENV) or DEFAULT_PLUGINS_DIR,
                       help=f"the kubelet's plugins folder (env {PLUGINS_DIR_ENV}; default %(default)s)")
    group.add_argument("--kubelet-registrar-dir",
                       default=env.get(REGISTRAR_DIR_ENV) or DEFAULT_REGISTRAR_DIR,
                       help=f"the kubelet's plugin registration folder (env {REGISTRAR_DIR_ENV}; "
                            "default %(default)s)")
    group.add_argument("--cdi-root", default=env.get(CDI_ROOT_ENV) or DEFAULT_CDI_ROOT,
                       help=f"where the per-claim CDI specs go (env {CDI_ROOT_ENV}; default %(default)s)")
    return parser


class Serving(Struct, frozen=True):
    """What one config puts in force: the config, GPUs, the devices published, their CDI spec writer."""

    config: Config
    inventory: Inventory
    devices: Mapping[str, DraDevice]
    specs: ClaimSpecWriter


class DraProcess:
    """The DRA plugin's life: choose a config, publish and serve it, follow wake-ups, shut down."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str], log: logging.Logger) -> None:
        self.args = args
        self.env = env
        self.log = log
        self.driver: str = args.driver_name
        self.node = node_name(env)
        self.plugin_dir = os.path.join(args.kubelet_plugins_dir, self.driver)
        self.recorder = Recorder()
        self.serving: Serving | None = None
        self.unhealthy: frozenset[str] = frozenset()
        self.client: Any = None
        self.publisher: SlicePublisher | None = None
        self.preparer: ClaimPreparer | None = None
        self.mps: ClaimMps | None = None
        self.server: DraServer | None = None
        self.health: HealthMonitor | None = None
        self.ledger: Ledger | None = None  # the GPUs that are down; outlives re-reads of the GPUs
        # Each published device's health (taints and the message the kubelet shows in the pod's status),
        # from the ledger's record; fed to the kubelet's health stream and to the slices.
        self.device_health: Mapping[str, DeviceHealth] = {}
        self.health_feed: HealthFeed | None = None
        self.informational = InformationalXids()
        self.unmonitored: set[str] = set()
        self.node_config: NodeConfig | None = None
        self.rule: NodeConfigRule | None = None
        self.endpoints: list[HttpEndpoints] = []
        self.not_serving_reason: str | None = "starting"
        self._lock = threading.Lock()  # the serving state, shared with the health and gRPC threads
        self._publishing = threading.Lock()
        self._publish_failed_at: float | None = None
        # The node's mode (nvdp.mode): slices only in "dra" mode, once the device plugin has withdrawn.
        self.gate: ModeGate | None = None
        self.handover: Handover | None = None
        self._withdrawn = False  # in "device-plugin" mode: this node's slices are deleted

    # --- one config ------------------------------------------------------------------------------

    def prepare(self, chosen: Chosen | None) -> Serving:
        """Config, GPUs, devices and CDI facts; StartupError / NvmlMissing, changing nothing."""
        from nvdp.cdi.errors import CdiError
        from nvdp.cdi.host import discover_host
        from nvdp.dra.cdi_specs import ClaimSpecWriter
        from nvdp.dra.devices import by_name
        from nvdp.dra.pool import pool_devices
        from nvdp.plan import PlanError
        from nvdp.plugin.imex import channels_on_node
        from nvdp.plugin.prepare import discover, load_config

        path = chosen.path if chosen is not None else None
        config = load_config(self.args, self.env, path, per_node=self.node_config is not None)
        self.log.info("Configuration from %s%s", config.source, f", {chosen.describe()}" if chosen else "")
        inventory = discover(config)
        config = channels_on_node(config)
        try:
            facts = discover_host(config, inventory)
        except CdiError as err:
            raise StartupError(f"cannot make CDI specs for this node's claims: {err}") from None
        for warning in facts.warnings:
            self.log.warning("CDI: %s", warning)
        try:
            devices = by_name(pool_devices(config, inventory))
        except PlanError as err:
            raise StartupError(f"invalid config for this node's GPUs: {err}") from None
        specs = ClaimSpecWriter(self.args.cdi_root, config, inventory, facts)
        return Serving(config, inventory, devices, specs)

    def switch(self, chosen: Chosen | None) -> None:
        """The per-node rule's switch: put `chosen` in force, or raise ConfigRefused serving as before."""
        from nvdp.dra.pool import env_default_mode, pool_warnings
        from nvdp.nodechoice import ConfigRefused

        try:
            mode = self.mode_of(chosen)
            self.mode_gate().check(mode)  # a mode switch while GPU pods run waits (ModeSwitchRefused)
            serving = self.prepare(chosen)
        except (StartupError, NvmlMissing) as err:
            raise ConfigRefused(str(err)) from None
        first = self.serving is None
        ledger = self.open_ledger(serving.config)
        with self._lock:
            self.serving = serving
            self.unhealthy = ledger.unhealthy  # GPUs that are down stay down across a re-read
            self.device_health = self.health_of(serving, ledger)
        if self.mps is not None:  # daemons already running keep their GPUs; their claims set their limits
            self.mps.inventory = serving.inventory
        names = ", ".join(serving.devices) or "none"
        self.log.info("Devices: %s", names)
        default_is, default_fix = env_default_mode(self.env)
        for warning in pool_warnings(serving.config, serving.inventory, mode, default_is=default_is,
                                     default_fix=default_fix):
            self.log.warning("%s", warning)
        self.enter_mode(mode, serving)
        if first:
            return
        self.publish()
        if self.handover is None:
            self.mode_gate().advertising()
        self.start_health()
        self.recorder.config_applied(serving.config.source, f"devices {names}", True, time.time(),
                                     notify=self.node_config is None)

    def view(self) -> NodeView:
        from nvdp.dra.state import NodeView

        with self._lock:
            assert self.serving is not None
            published = self.publisher is not None and self.publisher.taints_supported
            taints = {name: h.taints for name, h in self.device_health.items()} if published else {}
            return NodeView(devices=self.serving.devices, unhealthy=self.unhealthy, taints=taints)

    def health_of(self, serving: Serving, ledger: Ledger) -> dict[str, DeviceHealth]:
        """Each device's health from the ledger's record: the same function as `nvdp dra slices
        --health-record` and the doctor use."""
        from nvdp.dra.taints import device_health_for
        from nvdp.health.settings import settings_from_config

        quiet_s = settings_from_config(serving.config).after
        return device_health_for(serving.config, list(serving.devices.values()), ledger.record(),
                                 informational=self.informational.current(time.time(), quiet_s),
                                 unmonitored=frozenset(self.unmonitored))

    # --- the API server and the kubelet -------------------------------------------------------------

    def publish(self) -> None:
        # One publish at a time, each of the state read when it begins (a later change publishes
        # again); the state lock is not held over the API calls, so prepares never wait on them.
        with self._publishing:
            with self._lock:
                if self.publisher is None or self.serving is None:
                    return
                devices, unhealthy = list(self.serving.devices.values()), self.unhealthy
                health = dict(self.device_health)
            if self.gate is not None and self.gate.mode != "dra":
                if self.health_feed is not None:
                    self.health_feed.update({})
                self.withdraw()  # the device plugin serves this node: no slices
                return
            if self.health_feed is not None:
                self.health_feed.update(health)  # the kubelet's view of each device follows at once
            if self.handover is not None:
                return  # the device plugin still advertises: published once it has withdrawn
            try:
                writes = self.publisher.publish(devices, unhealthy, slice_taints(health))
            except Exception as err:  # tried again from the loop, and by the watch when it reconnects
                self.log.error("Cannot publish this node's ResourceSlices (retrying in %gs): %s",
                               REPUBLISH_AFTER_S, err)
                self._publish_failed_at = time.monotonic()
                return
            self._publish_failed_at = None
        if writes:
            self.log.info("ResourceSlices published (%d API write%s): %d device(s), %d unhealthy", writes,
                          "" if writes == 1 else "s", len(devices),
                          sum(1 for d in devices if d.uuid in unhealthy or d.gpu_uuid in unhealthy))

    def on_health(self, unhealthy: frozenset[str], changes: Sequence[Change]) -> None:
        """The health monitor's consumer: devices of GPUs that are down get their taints (or leave the
        slices where the API server has no taints), and lose them when they come back. A change of
        state without a change of the set (recovering -> needs a reset) changes taints and messages
        too, so the health is compared, not the set."""
        with self._lock:
            if self.serving is None or self.ledger is None:
                return
            health = self.health_of(self.serving, self.ledger)
            if unhealthy == self.unhealthy and health == self.device_health:
                return
            self.unhealthy, self.device_health = unhealthy, health
        self.publish()

    def on_notice(self, gpu: str, xid: int | None) -> None:
        """An XID outside the critical set, or a GPU that cannot be watched: a `None` taint only."""
        if xid is None:
            self.unmonitored.add(gpu)
        else:
            self.informational.seen(gpu, xid, time.time())
        if self.ledger is not None:
            self.on_health(self.ledger.unhealthy, ())

    def open_ledger(self, config: Config) -> Ledger:
        from nvdp.health.settings import open_ledger

        self.ledger = open_ledger(config, self.log, self.ledger)
        return self.ledger

    def start_health(self) -> None:
        from nvdp.plugin.health import monitor_for

        assert self.serving is not None
        if self.health is not None:
            self.health.stop()
        config = self.serving.config
        self.health = monitor_for(config, self.serving.inventory, self.open_ledger(config), self.on_health,
                                  self.log, recorder=self.recorder, writer="nvidia-dra-plugin",
                                  on_notice=self.on_notice)
        self.health.start()

    def start_serving(self) -> None:
        """After the first config: slices, prepared claims, the kubelet's sockets, health checks."""
        from nvdp.dra.health_service import HealthFeed
        from nvdp.dra.publish import SlicePublisher
        from nvdp.dra.server import DraServer
        from nvdp.dra.state import ClaimPreparer
        from nvdp.kube import connect, get_claim, list_claims

        client = connect(self.args.kubeconfig)
        self.client = client
        self.publisher = SlicePublisher(client, node=self.node, driver=self.driver, log=self.log,
                                        recorder=self.recorder)
        self.health_feed = HealthFeed(pool=self.node)
        self.publish()
        self.publisher.start_watch()
        os.makedirs(self.plugin_dir, exist_ok=True)
        sharing = self.node_sharing()
        self.preparer = ClaimPreparer(
            driver=self.driver, pool=self.node,
            checkpoint_path=os.path.join(self.plugin_dir, CHECKPOINT_FILE),
            lock_path=os.path.join(self.plugin_dir, LOCK_FILE),
            specs=_CurrentSpecs(self), get_claim=lambda ns, name: get_claim(client, ns, name),
            view=self.view, log=self.log, sharing=sharing)
        problem = self.preparer.restore(lambda: list_claims(client))
        if problem is not None:
            self.recorder.event("CheckpointSetAside", problem)
        self.server = DraServer(driver=self.driver, plugin_dir=self.plugin_dir,
                                registry_dir=self.args.kubelet_registrar_dir,
                                prepare=self.preparer.prepare, unprepare=self.preparer.unprepare,
                                log=self.log, on_registered=self.on_registered, recorder=self.recorder,
                                node=self.node, prepared=self.preparer.prepared, health=self.health_feed)
        self.server.start()
        self.start_health()
        self.not_serving_reason = None

    def node_sharing(self) -> NodeSharing:
        """Claims' sharing on this node; MPS when the pod has the MPS root (chart value dra.mps)."""
        from functools import partial

        from nvdp.dra.claim_events import ClaimEvents
        from nvdp.dra.mps import ClaimMps
        from nvdp.dra.sharing import NodeSharing
        from nvdp.mps.compute_mode import NvmlComputeModes
        from nvdp.mps.paths import CONTAINER_ROOT_ENV, HOST_ROOT_ENV, container_root

        assert self.serving is not None
        config = self.serving.config
        warner = ClaimEvents(self.client, node=self.node, component="nvidia-dra-plugin", log=self.log)
        if not (self.env.get(HOST_ROOT_ENV) or self.env.get(CONTAINER_ROOT_ENV)):
            return NodeSharing(driver=self.driver, mps=None, log=self.log, warner=warner, no_mps_reason=(
                f"the pod has no MPS root ({HOST_ROOT_ENV} is not set): install with the chart value "
                "dra.mps=true (the default), which mounts it and the MPS clients' /dev/shm"))
        self.mps = ClaimMps(
            root=container_root(self.env), host_root=self.env.get(HOST_ROOT_ENV) or config.flags.mps_root,
            driver=self.driver, inventory=self.serving.inventory,
            modes_factory=partial(NvmlComputeModes, config.flags.plugin.container_driver_root),
            log=self.log, recorder=self.recorder)
        return NodeSharing(driver=self.driver, mps=self.mps, log=self.log, no_mps_reason="", warner=warner)

    def on_registered(self, registered: bool, error: str) -> None:
        if registered:
            self.log.info("Registered with the kubelet as DRA driver %s", self.driver)
        else:
            self.log.error("The kubelet refused the registration of DRA driver %s: %s", self.driver, error)

    # --- the process ---------------------------------------------------------------------------------

    def check_start(self) -> str | None:
        problem = check_driver_name(self.driver)
        if problem is not None:
            return f"--driver-name / {DRIVER_ENV}: {problem}"
        if not self.node:
            return ("NODE_NAME is not set: the DRA plugin publishes this node's pool under its name; set it "
                    "from the pod's spec.nodeName (the chart does)")
        return None

    def start(self, inbox: Inbox) -> int | None:
        from nvdp.config.select import SelectionError
        from nvdp.kube import KubeConnectError
        from nvdp.nodechoice import ConfigRefused, NodeConfigRule
        from nvdp.nodeconfig import follow
        from nvdp.plugin.owned_socket import ServerStartError

        try:
            self.node_config = follow(self.args, self.env, lambda: inbox.post(Wake.NODE_CONFIG), self.log,
                                      recorder=self.recorder)
            report = self.node_config.report if self.node_config is not None else None
            self.rule = NodeConfigRule(self.node_config, report or (lambda *a, **k: None), self.log)
            self.rule.start(self.switch)
            self.start_serving()
        except (StartupError, ConfigRefused, SelectionError, KubeConnectError) as err:
            self.log.error("%s", err)
            return EXIT_FAILED
        except NvmlMissing as err:
            self.log.error("%s", err)
            return EXIT_FAILED
        except (OSError, ServerStartError) as err:  # the plugin folder, the checkpoint, a socket
            self.log.error("Cannot start the DRA plugin: %s", err)
            return EXIT_FAILED
        return None

    def on_wake(self, wakes: Wakes) -> int | None:
        assert self.rule is not None
        if Wake.RELOAD in wakes or Wake.NODE_CONFIG in wakes:
            forced = Wake.RELOAD in wakes
            self.log.info("%s: reloading the configuration and re-reading the GPUs",
                          "Received SIGHUP" if forced else "Node config changed")
            self.rule.again(self.switch, forced=forced)
        elif self.rule.retry_due():  # a mode switch that waited for GPU pods to go
            self.rule.again(self.switch, forced=False)
        if self.server is not None:
            from nvdp.plugin.owned_socket import ServerStartError

            try:
                self.server.check_sockets()
            except ServerStartError as err:  # tried again at the next tick
                self.log.error("Cannot make the DRA plugin's socket again: %s", err)
        if self.handover is not None and self.handover.done():
            self.handover = None
            self.publish()
            assert self.gate is not None
            self.gate.advertising()
        failed_at = self._publish_failed_at
        if failed_at is not None and time.monotonic() - failed_at >= REPUBLISH_AFTER_S:
            self.publish()
        self.expire_notices()
        return None

    def expire_notices(self) -> None:
        """An informational XID's `None` taint goes after the quiet period: re-published then."""
        from nvdp.health.settings import settings_from_config

        serving, ledger = self.serving, self.ledger
        if serving is None or ledger is None:
            return
        expiry = self.informational.next_expiry(settings_from_config(serving.config).after)
        if expiry is not None and time.time() >= expiry:
            self.on_health(ledger.unhealthy, ())

    # --- the node's mode (nvdp.mode) ---------------------------------------------------------------

    def mode_of(self, chosen: Chosen | None) -> Mode:
        """The mode `chosen` puts the node in (its config read once more, before anything is read from
        the GPUs, so a switch that must wait costs no NVML or driver-file reads)."""
        from nvdp.mode import node_mode
        from nvdp.plugin.prepare import load_config

        path = chosen.path if chosen is not None else None
        config = load_config(self.args, self.env, path, per_node=self.node_config is not None)
        return node_mode(config, self.env)

    def mode_gate(self) -> ModeGate:
        if self.gate is None:
            from nvdp.kube import KubeConnectError, connect
            from nvdp.mode import ModeGate, NodeApi

            try:
                api: NodeApi | None = NodeApi(connect(self.args.kubeconfig), self.node, self.driver,
                                              all_claims=True)
            except KubeConnectError:
                api = None  # the start fails on it a moment later, with the cause
            self.gate = ModeGate("dra", api, self.report, self.log, per_node=self.node_config is not None)
        return self.gate

    def report(self, reason: str, message: str, *, warning: bool = True) -> None:
        """Log, and record an Event on the Node."""
        from nvdp.nodechoice import node_report

        node_report(self.node_config, self.recorder, self.log)(reason, message, warning=warning)

    def enter_mode(self, mode: Mode, serving: Serving) -> None:
        """`mode` is in force: entering "dra", publish only once the device plugin has withdrawn."""
        from nvdp.mode import Handover, device_plugin_resources, planned_resources

        gate = self.mode_gate()
        entering = gate.mode != mode
        gate.enter(mode)
        if mode != "dra":
            self.handover = None
            return
        self._withdrawn = False
        api = gate.api
        if not entering or api is None:
            return
        names = planned_resources(serving.config, serving.inventory)

        def advertised() -> str | None:
            found = device_plugin_resources(api.allocatable(), names)
            return f"allocatable {', '.join(found)} on node {api.node}" if found else None

        handover = Handover("the device plugin to withdraw this node's GPUs", advertised, self.log)
        self.handover = None if handover.done() else handover

    def withdraw(self) -> None:
        """Delete this node's slices (once; the watch re-creates nothing while nothing is wanted)."""
        if self._withdrawn or self.publisher is None:
            return
        try:
            removed = self.publisher.remove_all()
        except Exception as err:  # tried again from the loop
            self.log.error("Cannot delete this node's ResourceSlices (retrying in %gs): %s",
                           REPUBLISH_AFTER_S, err)
            self._publish_failed_at = time.monotonic()
            return
        self._withdrawn = True
        self._publish_failed_at = None
        self.log.info("This node is in device-plugin mode: %s", f"{removed} ResourceSlice(s) deleted"
                      if removed else "no ResourceSlices published")

    def run(self, inbox: Inbox) -> int:
        from nvdp.node_events import NodeEvents

        problem = self.check_start()
        if problem is not None:
            self.log.error("%s", problem)
            return EXIT_USAGE
        try:
            self.endpoints = serve_probes(self, self.args, self.log)
        except OSError as err:
            self.log.error("%s; choose another port (--metrics-address / --health-address)", err)
            return EXIT_FAILED
        self.recorder.attach_events(NodeEvents.from_env(self.env, self.log, component="nvidia-dra-plugin"))
        try:
            failed = self.start(inbox)
            return failed if failed is not None else run(inbox, self.on_wake, self.log, lambda: TICK_S)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()
        if self.node_config is not None:
            self.node_config.stop()
        if self.health is not None:
            self.health.stop(timeout=0)
        if self.health_feed is not None:
            self.health_feed.close()  # ends the kubelet's health streams before the server stops
        if self.server is not None:
            # Removing the registration socket deregisters the driver. The slices stay: a restarted
            # plugin takes them over unchanged, and the kubelet removes them once no plugin of this
            # driver has registered for 30 s (an uninstall).
            self.log.info("Stopping the DRA plugin.")
            self.server.stop()
        if self.publisher is not None:
            self.publisher.stop()
        if self.mps is not None:
            # The daemons run in this container and end with it; stopping them puts the GPUs' compute
            # mode back. A restarted plugin starts them again for the claims still prepared.
            self.mps.stop()
        self.recorder.close()

    # --- probes --------------------------------------------------------------------------------------

    def readyz(self) -> Response:
        from nvdp.endpoints import Response

        if self.not_serving_reason is not None:
            return Response(503, f"not ready: {self.not_serving_reason}\n".encode())
        registered = self.server is not None and self.server.registered()
        lines = [f"driver {self.driver}: " + ("registered with the kubelet" if registered
                                               else "not registered with the kubelet yet")]
        status = 200 if registered else 503
        return Response(status, "\n".join(["ready" if registered else "not ready", *lines, ""]).encode())

    def healthz(self) -> Response:
        from nvdp.plugin.probes import Check, liveness

        checks = []
        if self.server is not None:
            sockets = (self.server.plugin_socket, self.server.registration_socket)
            # A missing socket is re-created by the loop within a second; gone for longer is a hang.
            absent = [path for path in sockets if not os.path.exists(path)]
            checks.append(Check("sockets", f"absent: {', '.join(absent)}" if absent else None))
        if self.health is not None:
            checks.append(Check("health loop", self.health.stalled(time.monotonic())))
        return liveness(checks)


class _CurrentSpecs:
    """The ClaimSpecs of whichever config is in force (a reload swaps the writer, not the preparer)."""

    def __init__(self, process: DraProcess) -> None:
        self._process = process

    def _writer(self) -> ClaimSpecWriter:
        serving = self._process.serving
        assert serving is not None
        return serving.specs

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None
              ) -> dict[str, str]:
        return self._writer().write(claim_uid, devices, extra)

    def remove(self, claim_uid: str) -> None:
        self._writer().remove(claim_uid)

    def exists(self, claim_uid: str) -> bool:
        return self._writer().exists(claim_uid)

    def present(self) -> frozenset[str]:
        return self._writer().present()


def serve_probes(process: DraProcess, args: argparse.Namespace, log: logging.Logger) -> list[HttpEndpoints]:
    """/healthz and /readyz on --health-address, and with /metrics on --metrics-address."""
    from nvdp.endpoints import Response, Route, start_endpoints
    from nvdp.plugin.guard import fatal

    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(200, generate_latest(process.recorder.enable_metrics().PLUGIN), CONTENT_TYPE_LATEST)

    probes: dict[str, Route] = {"/healthz": process.healthz, "/readyz": process.readyz}
    if args.metrics_address:
        process.recorder.enable_metrics()
    return start_endpoints(args.metrics_address, args.health_address, probes, metrics, log,
                           on_death=lambda what: fatal(log, what))


def main(argv: Sequence[str] | None = None) -> int:
    from nvdp.plugin import observe
    from nvdp.plugin.guard import on_fatal
    from nvdp.plugin.logs import setup_logging

    parser = build_parser()
    args = parser.parse_args(argv)
    observe.check_addresses(parser, args)
    setup_logging()
    log = logging.getLogger("nvidia-dra-plugin")
    log.info("Starting NVIDIA DRA kubelet plugin (nvdp %s), driver %s", __version__, args.driver_name)
    inbox = Inbox()
    on_fatal(inbox.post_fatal)
    try:
        return DraProcess(args, os.environ, log).run(inbox)
    finally:
        on_fatal(None)
        inbox.close()


if __name__ == "__main__":
    sys.exit(main())
