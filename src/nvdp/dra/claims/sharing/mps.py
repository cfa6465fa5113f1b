"""MPS for DRA claims: nvdp's supervised MPS control daemons, one per set of GPUs MPS claims share.

A GPU can serve one MPS server at a time (its compute mode goes to EXCLUSIVE_PROCESS), so claims that
share a GPU through MPS share its daemon: the daemon of a set of GPUs is started by the first claim
prepared on exactly that set and stopped (compute mode back to DEFAULT) when the last one is
unprepared. The daemon's ceiling, which MPS enforces for every client, is the largest limit among the
claims using it (`nvdp.dra.claims.sharing.mps_limits`): set before its first client can connect, raised when
a claim
asking for more joins and lowered when the largest leaves (for the servers started later and the next
clients of a running one). Each claim's own limits reach its containers as the MPS client variables
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) in its CDI spec, which lower
the ceiling for its clients.

The daemons are `nvdp.mps.supervisor.ResourceDaemon`s, as the MPS control-daemon DaemonSet runs them in
device-plugin mode: same start-up checks, probes, restarts, status file and readiness marker, under
`<MPS root>/<driver>/<name>/`, their clients' /dev/shm at `<MPS root>/<driver>/shm`. They run in the DRA
plugin's container, so a prepare waits for its daemon to answer and fails with the daemon's own error
when it does not.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from msgspec import Struct

from nvdp.daemon.report.recording import Recorder
from nvdp.dra.claims.sharing.mps_limits import (
    LIMITS_FILE,
    ClaimLimits,
    daemon_ceiling,
    describe_ceiling,
    write_limits,
)
from nvdp.inventory.model import Inventory
from nvdp.mps.commands import MpsGpu, MpsSettings
from nvdp.mps.compute_mode import ComputeModes
from nvdp.mps.control import MpsCommandError
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.supervisor import DEFAULT_PROBE_INTERVAL_S, ResourceDaemon

# Where a claim's containers find the daemon's pipe directory, as NVIDIA's DRA driver mounts it.
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
NO_LIMITS = ClaimLimits()  # the whole GPU
# How long a prepare waits for a new daemon to answer; the kubelet gives the whole call 45 s.
READY_WAIT_S = 20.0


class MpsUnavailable(Exception):
    """The daemon for a claim's GPUs cannot be had; the message says why and what to do."""


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
    """The MPS daemons of this node's DRA claims, and which claims use each."""

    def __init__(self, *, root: Path, host_root: str, driver: str, inventory: Inventory,
                 modes_factory: Callable[[], ComputeModes],
                 log: logging.Logger, recorder: Recorder, ready_wait_s: float = READY_WAIT_S,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S) -> None:
        self.root = root  # the MPS root as this container sees it
        self.host_root = host_root.rstrip("/") or "/"  # the same on the node, for the CDI mounts
        self.driver = driver
        self.inventory = inventory
        self._modes_factory = modes_factory
        self._modes: ComputeModes | None = None
        self.log = log
        self.recorder = recorder
        self.ready_wait_s = ready_wait_s
        self.probe_interval_s = probe_interval_s
        self._lock = threading.Lock()
        self._daemons: dict[tuple[str, ...], ResourceDaemon] = {}
        self._claims: dict[tuple[str, ...], dict[str, ClaimLimits]] = {}

    def users(self) -> dict[tuple[str, ...], frozenset[str]]:
        """The claims using each running daemon, by its GPUs."""
        with self._lock:
            return {gpus: frozenset(claims) for gpus, claims in self._claims.items()}

    def settings(self, gpus: Sequence[str]) -> MpsSettings | None:
        """The settings (ceiling included) the daemon of `gpus` runs with; None when it does not run."""
        with self._lock:
            daemon = self._daemons.get(self._key(gpus))
            return daemon.settings if daemon is not None else None

    def use(self, claim_uid: str, gpus: Sequence[str], limits: ClaimLimits = NO_LIMITS) -> MpsMount:
        """Start or join the daemon of `gpus` for the claim, waiting until it answers; a running daemon
        whose ceiling is below the claim's `limits` is raised to them first."""
        key = self._key(gpus)
        with self._lock:
            for other, claims in self._claims.items():
                uids = set(claims) - {claim_uid}
                if other != key and set(other) & set(key) and uids:
                    raise MpsUnavailable(
                        f"GPU(s) {', '.join(sorted(set(other) & set(key)))} already run an MPS daemon for "
                        f"the GPU set {', '.join(other)} (claims {', '.join(sorted(uids))}); one GPU serves "
                        "one MPS daemon: claims sharing a GPU through MPS must ask for the same GPUs")
            self._claims.setdefault(key, {})[claim_uid] = limits
            daemon = self._daemons.get(key)
            if daemon is None:
                daemon = self._start(key)
            else:
                before = daemon.settings.ceiling or daemon_ceiling(key, [])
                try:
                    self._retune(key, daemon)
                except MpsCommandError as err:
                    del self._claims[key][claim_uid]
                    with contextlib.suppress(MpsCommandError):
                        self._retune(key, daemon)
                    raise MpsUnavailable(
                        f"the MPS daemon of {', '.join(key)} runs with the ceiling "
                        f"{describe_ceiling(key, before)} and did not take the larger limits of this claim "
                        f"({limits.describe()}): {err}; the kubelet retries the prepare") from None
        try:
            self._wait_ready(daemon)
        except MpsUnavailable:
            self.release(claim_uid)
            raise
        return self.mount(key)

    def mount(self, gpus: Sequence[str]) -> MpsMount:
        name = daemon_name(self.driver, self._key(gpus))
        # The DRA plugin's own tmpfs (the chart's init container mounts it), apart from the MPS
        # control-daemon DaemonSet's <root>/shm, so neither pod's start or stop swaps the other's.
        return MpsMount(pipe_dir=f"{self.host_root}/{name}/pipe",
                        shm_dir=f"{self.host_root}/{self.driver}/shm")

    def release(self, claim_uid: str) -> None:
        """The claim no longer uses MPS; its daemon stops when no other claim does, and otherwise
        takes the ceiling of the claims left."""
        with self._lock:
            emptied = []
            for key, claims in self._claims.items():
                if claims.pop(claim_uid, None) is None:
                    continue
                if not claims:
                    emptied.append(key)
                elif (daemon := self._daemons.get(key)) is not None:
                    try:
                        self._retune(key, daemon)
                    except MpsCommandError as err:  # the ceiling stays higher: nothing is cut short
                        self.log.warning("%s: cannot lower the ceiling after claim %s left: %s",
                                         daemon.name, claim_uid, err)
            stopping = []
            for key in emptied:
                del self._claims[key]
                daemon = self._daemons.pop(key, None)
                if daemon is not None:
                    stopping.append(daemon)
        for daemon in stopping:
            (daemon.paths.base / LIMITS_FILE).unlink(missing_ok=True)
            self.log.info("%s: no claim uses it any more; stopping it", daemon.name)
            if not daemon.stop():
                self.log.error("%s: the compute mode of %s could not be restored to DEFAULT", daemon.name,
                               ", ".join(daemon.uuids))

    def adopt(self, claim_uid: str, gpus: Sequence[str], limits: ClaimLimits = NO_LIMITS) -> None:
        """At start-up: a claim prepared before a restart uses MPS on `gpus`; start its daemon again
        (not waited for: the claim's pods reconnect once it answers), with the ceiling of every claim
        adopted so far."""
        key = self._key(gpus)
        with self._lock:
            self._claims.setdefault(key, {})[claim_uid] = limits
            daemon = self._daemons.get(key)
            if daemon is None:
                self._start(key)
                return
            try:
                self._retune(key, daemon)
            except MpsCommandError as err:
                self.log.error("%s: cannot raise the ceiling for claim %s: %s", daemon.name, claim_uid, err)

    def stop(self) -> bool:
        """Stop every daemon (shut-down) and clean up the node as the MPS control daemon does on its
        final stop: pipe folders and markers go, and the clients' tmpfs this pod mounted is detached
        (pods still using it keep it; the next start mounts a fresh one). False when a compute mode
        stayed changed."""
        from nvdp.mps.host_setup import clean_up

        with self._lock:
            daemons = list(self._daemons.values())
            self._daemons.clear()
            self._claims.clear()
        restored = True
        for daemon in daemons:
            restored = daemon.stop() and restored
            (daemon.paths.base / LIMITS_FILE).unlink(missing_ok=True)  # none of its claims is served
        if self._modes is not None:
            self._modes.close()
            self._modes = None
        clean_up([d.settings for d in daemons], self.root, f"{self.host_root}/{self.driver}")
        return restored

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

    def _start(self, key: tuple[str, ...]) -> ResourceDaemon:
        if self._modes is None:
            self._modes = self._modes_factory()
        settings = self._settings(key)
        daemon = ResourceDaemon(settings, ResourcePaths(self.root, settings.resource_name), self._modes,
                                self.log, self.probe_interval_s, recorder=self.recorder)
        self.log.info("Starting the MPS control daemon %s", settings.describe())
        self._write_limits(key, daemon)
        daemon.start()
        self._daemons[key] = daemon
        return daemon

    def _retune(self, key: tuple[str, ...], daemon: ResourceDaemon) -> None:
        """Give a running daemon the ceiling of its claims now, if that changed (MpsCommandError)."""
        settings = self._settings(key)
        if settings.ceiling != daemon.settings.ceiling:
            daemon.retune(settings)
        self._write_limits(key, daemon)

    def _write_limits(self, key: tuple[str, ...], daemon: ResourceDaemon) -> None:
        ceiling = daemon.settings.ceiling or daemon_ceiling(key, [])
        try:
            daemon.paths.base.mkdir(parents=True, exist_ok=True)
            write_limits(daemon.paths.base / LIMITS_FILE, key, ceiling, self._claims.get(key, {}))
        except OSError as err:  # only nvdp doctor reads it; the daemon's own status says more
            self.log.warning("%s: cannot write %s: %s", daemon.name, LIMITS_FILE, err)

    def _wait_ready(self, daemon: ResourceDaemon) -> None:
        deadline = time.monotonic() + self.ready_wait_s
        while not daemon.paths.ready_marker.exists():
            if time.monotonic() > deadline:
                why = daemon.last_error or "it did not answer"
                raise MpsUnavailable(
                    f"the MPS control daemon for {', '.join(daemon.uuids)} is not ready after "
                    f"{self.ready_wait_s:g}s: {why}; see the plugin's log and {daemon.paths.status_file}; "
                    "the kubelet retries the prepare")
            time.sleep(0.05)


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

