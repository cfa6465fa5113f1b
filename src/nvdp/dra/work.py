"""The DRA plugin's own work on the daemon skeleton: one config's devices, published and prepared.

`switch` (the per-node rule's, nvdp.daemon.pernode.nodechoice) reads the config, the GPUs and the CDI driver
facts and
puts the devices in force; `begin` publishes the pool (nvdp.dra.pool.keeper), restores the prepared claims
(nvdp.dra.claims.preparer), registers with the kubelet (nvdp.dra.kubelet.server) and starts the health
checks; each loop
tick re-creates a removed socket, ends a mode hand-over and retries a failed publish.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nvdp.config.model import Config, Mode
from nvdp.config.names import node_name
from nvdp.daemon.errors import NvmlMissing, StartupError
from nvdp.daemon.handover import ModeHandover
from nvdp.daemon.healthwatch import HealthWatch
from nvdp.daemon.runloop import EXIT_FAILED, Wakes
from nvdp.daemon.skeleton import DaemonWork, Skeleton
from nvdp.dra import probes
from nvdp.dra.claims.checkpoint import CHECKPOINT_FILE
from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.keeper import SliceKeeper
from nvdp.dra.pool.taints import DeviceHealth, InformationalXids
from nvdp.dra.scale import ScaleGuard
from nvdp.dra.serving import Serving, prepare

if TYPE_CHECKING:
    from collections.abc import Callable

    from nvdp.daemon.pernode.mode import NodeApi
    from nvdp.daemon.pernode.nodeconfig import Chosen
    from nvdp.daemon.report.endpoints import Response
    from nvdp.dra.claims.cdi_specs import ClaimSpecWriter
    from nvdp.dra.claims.check import NodeView
    from nvdp.dra.claims.preparer import ClaimPreparer
    from nvdp.dra.claims.sharing.mps import ClaimMps
    from nvdp.dra.claims.sharing.node import NodeSharing
    from nvdp.dra.kubelet.server import DraServer
    from nvdp.health.ledger import Change, Ledger
    from nvdp.mps.node.handover import WaitReporter

LOCK_FILE = "pu.lock"
# The loop wakes this often to check that its sockets are still there (a kubelet's clean-up, or an
# operator, may remove them; the plugin watcher then forgets the driver until they are back).
TICK_S = 1.0


class DraWork(DaemonWork):
    """The devices in force, their slices, the claims prepared on them and the kubelet's sockets."""

    own_mode: Mode | None = "dra"

    def __init__(self, skeleton: Skeleton, args: argparse.Namespace) -> None:
        self.skeleton = skeleton
        self.log = skeleton.log
        self.recorder = skeleton.recorder
        self.args = args
        self.env = skeleton.env
        self.driver: str = args.driver_name
        self.node = node_name(self.env)
        self.plugin_dir = os.path.join(args.kubelet_plugins_dir, self.driver)
        self.serving: Serving | None = None
        self.unhealthy: frozenset[str] = frozenset()
        self.preparer: ClaimPreparer | None = None
        self.mps: ClaimMps | None = None
        self.mps_upgrade: WaitReporter | None = None
        self.server: DraServer | None = None
        self.health = HealthWatch(self.log, self.recorder, "nvidia-dra-plugin")
        # Each published device's health (taints and the message the kubelet shows in the pod's status),
        # from the ledger's record; fed to the kubelet's health stream and to the slices.
        self.device_health: Mapping[str, DeviceHealth] = {}
        self.informational = InformationalXids()
        self.unmonitored: set[str] = set()
        self.not_serving_reason: str | None = "starting"
        self._foreign_reported: frozenset[str] = frozenset()
        # migStrategy dynamic on a control plane without the scheduler's fix: one WARNING and Event per start.
        self.scale = ScaleGuard(lambda: skeleton.api.client(), self.recorder, self.log, self.env)
        self._lock = threading.Lock()  # the serving state, shared with the health and gRPC threads
        # The node's mode (nvdp.daemon.pernode.mode): slices only in "dra" mode, once the device plugin has
        # withdrawn.
        self.mode: ModeHandover | None = None
        self.slices = SliceKeeper(self.wanted, self._mode_in_force, self._waiting, self.log)

    # --- one config ------------------------------------------------------------------------------

    def load(self, chosen: Chosen | None) -> Config:
        from nvdp.daemon.inputs import load_config

        path = chosen.path if chosen is not None else None
        return load_config(self.args, self.env, path, per_node=self.skeleton.node_config is not None)

    def prepare(self, chosen: Chosen | None) -> Serving:
        """Config, GPUs, devices and CDI facts; StartupError / NvmlMissing, changing nothing."""
        from nvdp.dra.claims.checkpoint import read_owned_mig
        from nvdp.dra.claims.identity.metadata import HOST_SUBDIR

        owned = read_owned_mig(os.path.join(self.plugin_dir, CHECKPOINT_FILE))
        return prepare(self.load(chosen), chosen, self.args.cdi_root, self.log, owned.owns,
                       os.path.join(self.plugin_dir, HOST_SUBDIR))

    def mode_of(self, chosen: Chosen | None) -> Mode:
        """The mode `chosen` puts the node in (its config read once more, before anything is read from
        the GPUs, so a switch that must wait costs no NVML or driver-file reads)."""
        from nvdp.daemon.pernode.mode import node_mode

        return node_mode(self.load(chosen), self.env)

    def switch(self, chosen: Chosen | None) -> None:
        """The per-node rule's switch: put `chosen` in force, or raise ConfigRefused serving as before."""
        from nvdp.daemon.pernode.nodechoice import ConfigRefused
        from nvdp.dra.pool.contents import env_default_mode, pool_warnings

        handover = self.mode_handover()
        try:
            mode = self.mode_of(chosen)
            handover.gate.check(mode)  # a mode switch while GPU pods run waits (ModeSwitchRefused)
            serving = self.prepare(chosen)
        except (StartupError, NvmlMissing) as err:
            raise ConfigRefused(str(err)) from None
        first = self.serving is None
        ledger = self.health.open_ledger(serving.config)
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
        self.report_foreign(serving)
        self.scale.check(serving.config, mode, serving.devices.values())
        if mode == "dra":
            self.slices.withdrawn = False
        handover.enter(mode)
        if first:
            return
        self.slices.publish()
        if not handover.waiting:
            handover.advertising()
        self.start_health()
        self.recorder.config_applied(serving.config.source, f"devices {names}", True, time.time(),
                                     notify=self.skeleton.node_config is None)

    def report_foreign(self, serving: Serving) -> None:
        """migStrategy dynamic: one Warning Event when MIG devices nvdp did not make hold placements."""
        from nvdp.dra.serving import foreign_report

        seen, message = foreign_report(serving, os.path.join(self.plugin_dir, CHECKPOINT_FILE))
        if message and seen != self._foreign_reported:
            self.recorder.event("ForeignMigDevices", message)
        self._foreign_reported = seen

    def wanted(self) -> tuple[Sequence[DraDevice], frozenset[str], Mapping[str, DeviceHealth]] | None:
        with self._lock:
            if self.serving is None:
                return None
            return list(self.serving.devices.values()), self.unhealthy, dict(self.device_health)

    def view(self) -> NodeView:
        from nvdp.dra.claims.check import NodeView

        with self._lock:
            assert self.serving is not None
            publisher = self.slices.publisher
            published = publisher is not None and publisher.taints_supported
            taints = {name: h.taints for name, h in self.device_health.items()} if published else {}
            return NodeView(devices=self.serving.devices, unhealthy=self.unhealthy, taints=taints)

    def health_of(self, serving: Serving, ledger: Ledger) -> dict[str, DeviceHealth]:
        """Each device's health from the ledger's record: the same function as `nvdp dra slices
        --health-record` and the doctor use."""
        from nvdp.dra.pool.taints import device_health_for
        from nvdp.health.settings import settings_from_config

        quiet_s = settings_from_config(serving.config).after
        return device_health_for(serving.config, list(serving.devices.values()), ledger.record(),
                                 informational=self.informational.current(time.time(), quiet_s),
                                 unmonitored=frozenset(self.unmonitored))

    # --- the node's mode (nvdp.daemon.pernode.mode)
    # -------------------------------------------------------------

    def mode_api(self) -> NodeApi | None:
        """The pods using this node's GPUs come from the kubelet's pod-resources API (the socket the
        plugin reads claim holders from), never from a list of pods through the API server; the claims
        allocated here that no container holds yet from the claims list."""
        from nvdp.daemon.podresources import kubelet_pods

        return self.skeleton.api.node_api(self.node, self.driver, self.log, all_claims=True,
                                          kubelet_pods=kubelet_pods(self.args.kubelet_pod_resources_socket))

    def mode_handover(self) -> ModeHandover:
        """Entering "dra", publish only once the device plugin has withdrawn this node's GPUs."""
        if self.mode is None:
            gate = self.skeleton.gate
            assert gate is not None
            self.mode = ModeHandover(gate, self._waits, self.log)
        return self.mode

    def _waits(self, api: NodeApi) -> tuple[str, Callable[[], str | None]] | None:
        from nvdp.daemon.pernode.mode import device_plugin_resources, planned_resources

        serving = self.serving
        assert serving is not None
        names = planned_resources(serving.config, serving.inventory)

        def advertised() -> str | None:
            found = device_plugin_resources(api.allocatable(), names)
            return f"allocatable {', '.join(found)} on node {api.node}" if found else None

        return "the device plugin to withdraw this node's GPUs", advertised

    def _mode_in_force(self) -> Mode | None:
        gate = self.skeleton.gate
        return gate.mode if gate is not None else None

    def _waiting(self) -> bool:
        return self.mode is not None and self.mode.waiting

    # --- serving ---------------------------------------------------------------------------------

    def begin(self) -> int | None:
        """After the first config: slices, prepared claims, the kubelet's sockets, health checks."""
        from nvdp.daemon.podresources.client import claims_in_use
        from nvdp.dra.claims.cdi_specs import CurrentSpecs
        from nvdp.dra.claims.preparer import ClaimPreparer
        from nvdp.dra.kubelet.health_service import HealthFeed
        from nvdp.dra.kubelet.server import DraServer
        from nvdp.dra.pool.publish import SlicePublisher
        from nvdp.dra.serving import claim_instances, claim_status
        from nvdp.kube import get_claim, list_claims

        client = self.skeleton.api.client()
        self.slices.publisher = SlicePublisher(client, node=self.node, driver=self.driver, log=self.log,
                                               recorder=self.recorder)
        self.slices.feed = HealthFeed(pool=self.node)
        self.slices.publish()
        self.slices.publisher.start_watch()
        os.makedirs(self.plugin_dir, exist_ok=True)
        self.preparer = ClaimPreparer(
            driver=self.driver, pool=self.node,
            checkpoint_path=os.path.join(self.plugin_dir, CHECKPOINT_FILE),
            lock_path=os.path.join(self.plugin_dir, LOCK_FILE),
            specs=CurrentSpecs(self._writer), get_claim=lambda ns, name: get_claim(client, ns, name),
            view=self.view, log=self.log, sharing=self.node_sharing(client),
            instances=claim_instances(self.serving, self.log), status=claim_status(client, self.driver),
            in_use=lambda: {(u.namespace, u.name)
                            for u in claims_in_use(self.args.kubelet_pod_resources_socket)})
        problem = self.preparer.restore(lambda: list_claims(client))
        if problem is not None:
            self.recorder.event("CheckpointSetAside", problem)
        self.server = DraServer(driver=self.driver, plugin_dir=self.plugin_dir,
                                registry_dir=self.args.kubelet_registrar_dir,
                                prepare=self.preparer.prepare, unprepare=self.preparer.unprepare,
                                log=self.log, recorder=self.recorder,
                                node=self.node, prepared=self.preparer.prepared, health=self.slices.feed,
                                instance=self.args.instance)
        self.server.start()
        self.start_health()
        self.not_serving_reason = None
        return None

    def _writer(self) -> ClaimSpecWriter:
        serving = self.serving
        assert serving is not None
        return serving.specs

    def node_sharing(self, client: Any) -> NodeSharing:
        from nvdp.dra.serving import node_sharing

        assert self.serving is not None
        sharing, self.mps = node_sharing(client, self.serving, self.env, self.driver, self.node, self.log,
                                         self.recorder)
        if self.mps is not None:  # a new MPS daemon pod that waits for this node's claims: an Event says so
            from nvdp.mps.node.handover import WaitReporter

            self.mps_upgrade = WaitReporter(self.mps.root / self.driver, self.node, self.recorder.event)
        return sharing

    def on_health(self, unhealthy: frozenset[str], changes: Sequence[Change]) -> None:
        """The health monitor's consumer: devices of GPUs that are down get their taints (or leave the
        slices where the API server has no taints), and lose them when they come back. A change of
        state without a change of the set (recovering -> needs a reset) changes taints and messages
        too, so the health is compared, not the set."""
        with self._lock:
            ledger = self.health.ledger
            if self.serving is None or ledger is None:
                return
            health = self.health_of(self.serving, ledger)
            if unhealthy == self.unhealthy and health == self.device_health:
                return
            self.unhealthy, self.device_health = unhealthy, health
        self.slices.publish()

    def on_notice(self, gpu: str, xid: int | None) -> None:
        """An XID outside the critical set, or a GPU that cannot be watched: a `None` taint only."""
        if xid is None:
            self.unmonitored.add(gpu)
        else:
            self.informational.seen(gpu, xid, time.time())
        if self.health.ledger is not None:
            self.on_health(self.health.ledger.unhealthy, ())

    def expire_notices(self) -> None:
        """An informational XID's `None` taint goes after the quiet period: re-published then."""
        from nvdp.health.settings import settings_from_config

        serving, ledger = self.serving, self.health.ledger
        if serving is None or ledger is None:
            return
        expiry = self.informational.next_expiry(settings_from_config(serving.config).after)
        if expiry is not None and time.time() >= expiry:
            self.on_health(ledger.unhealthy, ())

    def start_health(self) -> None:
        assert self.serving is not None
        self.health.start(self.serving.config, self.serving.inventory, self.on_health,
                          on_notice=self.on_notice)

    # --- the loop and the end --------------------------------------------------------------------

    def start_failed(self, err: Exception) -> int | None:
        from nvdp.config.select import SelectionError
        from nvdp.daemon.owned_socket import ServerStartError
        from nvdp.daemon.pernode.nodechoice import ConfigRefused
        from nvdp.kube import KubeConnectError

        if isinstance(err, (StartupError, ConfigRefused, SelectionError, KubeConnectError, NvmlMissing)):
            self.log.error("%s", err)
        elif isinstance(err, (OSError, ServerStartError)):  # the plugin folder, the checkpoint, a socket
            self.log.error("Cannot start the DRA plugin: %s", err)
        else:
            raise err
        return EXIT_FAILED

    def replanning(self, why: str, *, retry: bool) -> None:
        if not retry:
            self.log.info("%s: reloading the configuration and re-reading the GPUs", why)

    def step(self, wakes: Wakes) -> int | None:
        if self.server is not None:
            from nvdp.daemon.owned_socket import ServerStartError

            try:
                self.server.check_sockets()
            except ServerStartError as err:  # tried again at the next tick
                self.log.error("Cannot make the DRA plugin's socket again: %s", err)
        if self.mode is not None and self.mode.poll():
            self.slices.publish()
            self.mode.advertising()
        self.slices.retry()
        self.expire_notices()
        if self.mps_upgrade is not None:
            self.mps_upgrade.check()
        if self.preparer is not None:
            self.preparer.catch_up()  # a lost checkpoint's rebuild, claim statuses: once the API answers
        return None

    def wake_after(self) -> float | None:
        return TICK_S

    def stop(self) -> None:
        self.health.stop(timeout=0)
        if self.slices.feed is not None:
            self.slices.feed.close()  # ends the kubelet's health streams before the server stops
        if self.server is not None:
            # Removing the registration socket deregisters the driver. The slices stay: a restarted
            # plugin takes them over unchanged, and the kubelet removes them once no plugin of this
            # driver has registered for 30 s (an uninstall).
            self.log.info("Stopping the DRA plugin.")
            self.server.stop()
        if self.slices.publisher is not None:
            self.slices.publisher.stop()
        if self.mps is not None:
            # The daemons run on in the MPS image's pod for the claims still prepared; a restarted
            # plugin adopts them (nvdp.dra.claims.sharing.mps).
            self.mps.stop()

    # --- probes ----------------------------------------------------------------------------------

    def readyz(self) -> Response:
        return probes.readyz(self)

    def healthz(self) -> Response:
        return probes.healthz(self)
