"""`mps-control-daemon --dra-driver`'s work on the daemon skeleton: the DRA plugin's orders, carried out.

No config file, no per-node config, no API access: the orders under `<MPS root>/<driver>/orders` say
everything. An MPS root that cannot hold the daemons' state ends the start (exit 1, with the fix)
before any compute mode changes; then the orders are read at `begin` and every ORDER_POLL_S, and the
final stop (SIGTERM) stops every daemon and restores the compute modes (exit 1 if one stayed changed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nvdp.daemon.pernode.nodeconfig import Chosen
from nvdp.daemon.runloop import EXIT_FAILED, Wakes
from nvdp.daemon.skeleton import DaemonWork, Skeleton
from nvdp.mps.compute_mode import ComputeModes
from nvdp.mps.node.handover import Handover, Users
from nvdp.mps.ordered.daemons import ModesUnavailable, OrderedDaemons
from nvdp.mps.ordered.orders import orders_dir, read_orders
from nvdp.mps.paths import unusable_root, unusable_root_message
from nvdp.mps.work import HANDOVER_POLL_S, CannotStart

# How often the orders are read: a prepare waits for its order, and a pass over a few files is cheap.
ORDER_POLL_S = 0.2


class OrderedDaemonsWork(DaemonWork):
    """Carries out the orders of DRA driver `driver` under `root` (the MPS root in this container)."""

    def __init__(self, skeleton: Skeleton, root: Path, driver: str, probe_interval_s: float,
                 modes_factory: Callable[[], ComputeModes]) -> None:
        self.skeleton = skeleton
        self.log = skeleton.log
        self.root = root
        self.driver = driver
        self.daemons = OrderedDaemons(root, driver, modes_factory, skeleton.log, probe_interval_s,
                                      recorder=skeleton.recorder)
        self._checked = False
        self.handover = Handover.from_env(root / driver, self._users, skeleton.log)

    def switch(self, chosen: Chosen | None) -> None:
        # Called once at start (no config to choose) and on SIGHUP, which has nothing to reload.
        if self._checked:
            self.log.info("nothing to reload: the orders are read every %gs", ORDER_POLL_S)
            return
        problem = unusable_root(self.root, self.root / self.driver)
        if problem is not None:
            # Exit so the pod shows the failure (CrashLoopBackOff) instead of looking Running.
            raise CannotStart(unusable_root_message(self.root, problem))
        self._checked = True

    def begin(self) -> int | None:
        self.log.info("carrying out the MPS daemon orders of DRA driver %s in %s", self.driver,
                      orders_dir(self.root, self.driver))
        return self._pass()

    def step(self, wakes: Wakes) -> int | None:
        return self._pass()

    def wake_after(self) -> float | None:
        return ORDER_POLL_S if self.handover.holding else HANDOVER_POLL_S

    def finish(self, code: int) -> int:
        """The final stop: daemons down, compute modes back to DEFAULT, host state cleaned up, unless a
        new pod of this node waits to take over: it shares that state (nvdp.mps.node.handover)."""
        if not self.handover.holding:
            self.handover.close()
            return code
        self.log.info("stopping the MPS daemons of DRA driver %s (their orders stay)", self.driver)
        successor = self.handover.successor_waiting()
        if successor:
            self.log.info("a new MPS daemon pod waits to take over: the MPS tmpfs and folders stay")
        restored = self.daemons.stop(clean_up_host=not successor)
        self.handover.close(last=not successor)
        if not restored:
            self.log.error("stopped, but a GPU's compute mode could not be restored to DEFAULT (see above)")
            return code or EXIT_FAILED
        return code

    def stop(self) -> None:
        # After a failed start or a fatal error too; a no-op after `finish`. A pod still waiting for its
        # turn started nothing, and the host's state (the tmpfs it shares) is the running pod's.
        if self.handover.holding:
            self.daemons.stop(clean_up_host=not self.handover.successor_waiting())

    def _users(self) -> Users:
        """The claims whose daemons the running pod serves: an order stands while its claims are
        prepared, and the kubelet unprepares a claim only once its pod has ended."""
        orders = read_orders(self.root, self.driver)
        return Users(names=tuple(sorted(f"claim {uid}" for order in orders.values() for uid in order.claims)))

    def _pass(self) -> int | None:
        if not self.handover.take():
            return None
        try:
            self.daemons.reconcile()
        except ModesUnavailable as err:
            # As in device-plugin mode: a node where compute modes cannot be set gets no daemons; the
            # pod restarts (and shows why) rather than look healthy while every prepare times out.
            self.log.error("cannot start an MPS control daemon: %s", err)
            return EXIT_FAILED
        return None
