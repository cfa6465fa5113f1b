"""MPS for DRA claims: one MPS control daemon per set of GPUs that MPS claims share, ordered from the
MPS control-daemon image.

A GPU can serve one MPS server at a time (its compute mode goes to EXCLUSIVE_PROCESS), so claims that
share a GPU through MPS share its daemon: the daemon of a set of GPUs is ordered by the first claim
prepared on exactly that set and withdrawn when the last one is unprepared. The daemon's ceiling, which
MPS enforces for every client, is the largest limit among the claims using it
(`nvdp.dra.claims.sharing.mps_limits`): set before its first client can connect, raised when a claim
asking for more joins and lowered when the largest leaves (for the servers started later and the next
clients of a running one). Each claim's own limits reach its containers as the MPS client variables
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) in its CDI spec, which lower
the ceiling for its clients.

The daemons do not run in the DRA plugin's container, which a restart, crash or upgrade would take
down with every MPS server and client in it. The plugin writes an order per daemon
(`nvdp.mps.ordered.orders`) and the MPS image's `<release>-dra-mps` DaemonSet carries it out
(`nvidia-mps-control-daemon --dra-driver`): the same supervised daemons as in device-plugin mode (start-up
checks, probes, restarts, status file and readiness marker) under `<MPS root>/<driver>/<name>/`, their
clients' /dev/shm at `<MPS root>/<driver>/shm`. A prepare waits until the order is carried out and the
daemon answers, and fails with the daemon's own error when it does not. A restarted plugin adopts what
its checkpoint says is prepared (`adopt`, the same order again: nothing restarts) and withdraws the
orders no prepared claim uses any more (`settle`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from msgspec import Struct

from nvdp.dra.claims.sharing.mps_limits import (
    LIMITS_FILE,
    ClaimLimits,
    daemon_ceiling,
    describe_ceiling,
    write_limits,
)
from nvdp.inventory.model import Inventory
from nvdp.mps.commands import MpsGpu, MpsSettings
from nvdp.mps.ordered.orders import (
    Applied,
    DaemonOrder,
    changed,
    order_path,
    read_applied,
    read_order,
    read_orders,
    remove_order,
    write_order,
)
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.status import read_status

# Where a claim's containers find the daemon's pipe directory, as NVIDIA's DRA driver mounts it.
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
NO_LIMITS = ClaimLimits()  # the whole GPU
# How long a prepare waits for a new daemon to answer; the kubelet gives the whole call 45 s.
READY_WAIT_S = 20.0
# How often a prepare looks whether its order was carried out (the MPS image looks every 0.2 s).
POLL_S = 0.05
# Who carries the orders out, for messages: the chart names its DaemonSet in this variable.
MPS_RUNNER_ENV = "NVDP_DRA_MPS_DAEMONSET"
RUNNER = "the MPS image's dra-mps DaemonSet"


class MpsUnavailable(Exception):
    """The daemon for a claim's GPUs cannot be had; the message says why and what to do."""


class RetuneRefused(Exception):
    """The running daemon did not take its order's new ceiling (the MPS image's error)."""


class MpsMount(Struct, frozen=True):
    """The host folders a claim's containers get: the daemon's pipe folder and the shared /dev/shm."""

    pipe_dir: str
    shm_dir: str


def daemon_name(driver: str, gpus: Sequence[str]) -> str:
    """`<driver>/<GPU UUID>` for one GPU; a hash of the set for several (socket paths stay short)."""
    if len(gpus) == 1:
        return f"{driver}/{gpus[0]}"
    digest = hashlib.sha256(",".join(sorted(gpus)).encode()).hexdigest()[:12]
    return f"{driver}/gpus-{digest}"


class ClaimMps:
    """The MPS daemons ordered for this node's DRA claims, and which claims use each."""

    def __init__(self, *, root: Path, host_root: str, driver: str, inventory: Inventory,
                 log: logging.Logger, ready_wait_s: float = READY_WAIT_S, poll_s: float = POLL_S,
                 runner: str = RUNNER) -> None:
        self.root = root  # the MPS root as this container sees it
        self.host_root = host_root.rstrip("/") or "/"  # the same on the node, for the CDI mounts
        self.driver = driver
        self.inventory = inventory
        self.log = log
        self.ready_wait_s = ready_wait_s
        self.poll_s = poll_s
        self.runner = runner  # who carries the orders out, for messages
        self._lock = threading.Lock()
        self._orders: dict[tuple[str, ...], DaemonOrder] = {}
        self._claims: dict[tuple[str, ...], dict[str, ClaimLimits]] = {}

    def users(self) -> dict[tuple[str, ...], frozenset[str]]:
        """The claims using each ordered daemon, by its GPUs."""
        with self._lock:
            return {gpus: frozenset(claims) for gpus, claims in self._claims.items()}

    def settings(self, gpus: Sequence[str]) -> MpsSettings | None:
        """The settings (ceiling included) the daemon of `gpus` is ordered with; None when it is not."""
        with self._lock:
            order = self._orders.get(self._key(gpus))
            return order.settings if order is not None else None

    def use(self, claim_uid: str, gpus: Sequence[str], limits: ClaimLimits = NO_LIMITS) -> MpsMount:
        """Order or join the daemon of `gpus` for the claim, waiting until it answers with a ceiling that
        covers the claim's `limits` (a running daemon below them is raised first)."""
        key = self._key(gpus)
        with self._lock:
            for other, claims in self._claims.items():
                uids = set(claims) - {claim_uid}
                if other != key and set(other) & set(key) and uids:
                    raise MpsUnavailable(
                        f"GPU(s) {', '.join(sorted(set(other) & set(key)))} already run an MPS daemon for "
                        f"the GPU set {', '.join(other)} (claims {', '.join(sorted(uids))}); one GPU serves "
                        "one MPS daemon: claims sharing a GPU through MPS must ask for the same GPUs")
            previous = self._orders.get(key)
            self._claims.setdefault(key, {})[claim_uid] = limits
            order = self._order(key)
        try:
            self._wait_done(order)
        except MpsUnavailable:
            self.release(claim_uid)
            raise
        except RetuneRefused as err:
            self.release(claim_uid)
            before = previous.settings.ceiling if previous is not None else None
            raise MpsUnavailable(
                f"the MPS daemon of {', '.join(key)} runs with the ceiling "
                f"{describe_ceiling(key, before or daemon_ceiling(key, []))} and did not take the larger "
                f"limits of this claim ({limits.describe()}): {err}; the kubelet retries the prepare"
            ) from None
        return self.mount(key)

    def mount(self, gpus: Sequence[str]) -> MpsMount:
        name = daemon_name(self.driver, self._key(gpus))
        # The DRA daemons' own tmpfs (mounted by the dra-mps DaemonSet's init container), apart from the
        # device-plugin mode's <root>/shm, so neither pod's start or stop swaps the other's.
        return MpsMount(pipe_dir=f"{self.host_root}/{name}/pipe",
                        shm_dir=f"{self.host_root}/{self.driver}/shm")

    def release(self, claim_uid: str) -> None:
        """The claim no longer uses MPS; its daemon's order is withdrawn when no other claim uses it, and
        otherwise carries the ceiling of the claims left (not waited for: nothing is cut short)."""
        with self._lock:
            for key in [k for k, claims in self._claims.items() if claim_uid in claims]:
                del self._claims[key][claim_uid]
                self._order(key)

    def adopt(self, claim_uid: str, gpus: Sequence[str], limits: ClaimLimits = NO_LIMITS) -> None:
        """At start-up: a claim prepared before a restart uses MPS on `gpus`. Its daemon's order is
        written again only where it changed (a daemon that runs keeps running); not waited for."""
        key = self._key(gpus)
        with self._lock:
            self._claims.setdefault(key, {})[claim_uid] = limits
            self._order(key)

    def settle(self) -> None:
        """Once every prepared claim is adopted: withdraw the orders on disk that no prepared claim uses
        (left by a plugin that stopped between ordering a daemon and recording its claim)."""
        with self._lock:
            for name, order in read_orders(self.root, self.driver).items():
                key = tuple(g.uuid for g in order.settings.gpus)
                if not self._claims.get(key):
                    self.log.info("%s: no prepared claim uses it; withdrawing its order", name)
                    self._withdraw(key, name)

    def stop(self) -> bool:
        """Shut-down: the daemons run on in the MPS image's pod, serving the claims still prepared; a
        restarted plugin adopts them. Nothing to undo here."""
        return True

    # --- inside ------------------------------------------------------------------------------------

    def _key(self, gpus: Sequence[str]) -> tuple[str, ...]:
        order = {g.uuid: g.index for g in self.inventory.gpus}
        unknown = [u for u in gpus if u not in order]
        if unknown:
            raise MpsUnavailable(f"GPU(s) {', '.join(unknown)} are not in this node's inventory")
        return tuple(sorted(set(gpus), key=lambda u: order[u]))

    def _settings(self, key: tuple[str, ...]) -> MpsSettings:
        """The daemon's GPUs, with the ceiling of the claims that use it now."""
        gpus = []
        for ordinal, uuid in enumerate(key):
            gpu = self.inventory.gpu(uuid)
            assert gpu is not None  # _key checked
            gpus.append(MpsGpu(uuid=gpu.uuid, index=gpu.index, ordinal=ordinal, name=gpu.name,
                               memory_bytes=gpu.memory_bytes, compute_capability=gpu.compute_capability,
                               replicas=1))
        ceiling = daemon_ceiling(key, self._claims.get(key, {}).values())
        return MpsSettings(resource_name=daemon_name(self.driver, key), gpus=tuple(gpus), ceiling=ceiling)

    def _order(self, key: tuple[str, ...]) -> DaemonOrder:
        """Write the daemon's order as its claims now say (withdrawn when none is left); the order in
        force. Held under the lock. MpsUnavailable when the MPS root cannot be written."""
        claims = self._claims.get(key, {})
        settings = self._settings(key)
        if not claims:
            self._withdraw(key, settings.resource_name)
            return DaemonOrder(settings=settings, generation=0)
        # The file, not only this instance's memory: another instance (the old pod of a rolling update)
        # may have written a later generation.
        on_disk = read_order(order_path(self.root, DaemonOrder(settings, 0)))
        known = self._orders.get(key)
        before = max((o for o in (on_disk, known) if o is not None), key=lambda o: o.generation, default=None)
        if before is not None and not changed(before, settings, claims):
            self._orders[key] = before
            return before
        order = DaemonOrder(settings=settings, generation=(before.generation if before else 0) + 1,
                            claims=tuple(sorted(claims)))
        try:
            write_order(self.root, order)
        except OSError as err:
            raise MpsUnavailable(f"cannot write the MPS daemon's order under {self.root}: {err}; the MPS "
                                 "root must be writable by the DRA plugin (chart value mps.root)") from None
        self._orders[key] = order
        self._write_limits(key, order)
        self.log.info("Ordered the MPS control daemon %s (generation %d, claims %s)", settings.describe(),
                      order.generation, ", ".join(order.claims))
        return order

    def _withdraw(self, key: tuple[str, ...], name: str) -> None:
        self._orders.pop(key, None)
        self._claims.pop(key, None)
        remove_order(self.root, self.driver, name)
        (ResourcePaths(self.root, name).base / LIMITS_FILE).unlink(missing_ok=True)
        self.log.info("Withdrew the order of the MPS control daemon %s: no claim uses it", name)

    def _write_limits(self, key: tuple[str, ...], order: DaemonOrder) -> None:
        ceiling = order.settings.ceiling or daemon_ceiling(key, [])
        base = ResourcePaths(self.root, order.name).base
        try:
            base.mkdir(parents=True, exist_ok=True)
            write_limits(base / LIMITS_FILE, key, ceiling, self._claims.get(key, {}))
        except OSError as err:  # only nvdp doctor reads it; the daemon's own status says more
            self.log.warning("%s: cannot write %s: %s", order.name, LIMITS_FILE, err)

    def _wait_done(self, order: DaemonOrder) -> None:
        """Until the MPS image carried out `order` (or a later one) and the daemon answers.
        RetuneRefused when it refused the order's ceiling; MpsUnavailable after ready_wait_s."""
        paths = ResourcePaths(self.root, order.name)
        deadline = time.monotonic() + self.ready_wait_s
        while True:
            applied = read_applied(paths.base)
            if applied is not None and applied.generation >= order.generation:
                if applied.error is not None and applied.generation == order.generation:
                    raise RetuneRefused(applied.error)
                if paths.ready_marker.exists():
                    return
            if time.monotonic() > deadline:
                raise MpsUnavailable(self._not_done(order, applied, paths))
            time.sleep(self.poll_s)

    def _not_done(self, order: DaemonOrder, applied: Applied | None, paths: ResourcePaths) -> str:
        gpus = ", ".join(g.uuid for g in order.settings.gpus)
        if applied is None or applied.generation < order.generation:
            why = (f"its order (generation {order.generation}) was not taken: {self.runner} does not run "
                   "on this node or cannot read the MPS root; check that DaemonSet's pod on this node and "
                   "its log")
        else:
            status = read_status(paths.status_file)
            why = (status.error if status is not None and status.error else None) or "it did not answer"
        return (f"the MPS control daemon for {gpus} is not ready after {self.ready_wait_s:g}s: {why}; see "
                f"{paths.status_file}; the kubelet retries the prepare")


def claim_limits(thread_percentage: int | None, memory_mib: Sequence[tuple[str, int | None]]) -> ClaimLimits:
    """A claim's limits for its daemon's ceiling: its thread share, and its memory limit per GPU."""
    return ClaimLimits(thread_percentage=thread_percentage,
                       memory_mib=tuple((gpu, mib) for gpu, mib in memory_mib if mib is not None))


def client_env(thread_percentage: int | None, memory_mib: Sequence[int | None]) -> dict[str, str]:
    """A claim's MPS client limits: its thread share, and each of its devices' pinned-memory limit by
    the device's position in the claim (the ordinal its containers see it at)."""
    env = {PIPE_ENV: CONTAINER_PIPE_DIR}
    if thread_percentage is not None:
        env[THREADS_ENV] = str(thread_percentage)
    limits = [f"{i}={mib}M" for i, mib in enumerate(memory_mib) if mib is not None]
    if limits:
        env[MEMORY_ENV] = ",".join(limits)
    return env

