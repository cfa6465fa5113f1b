"""MPS for DRA claims: nvdp's supervised MPS control daemons, one per set of GPUs MPS claims share.

A GPU can serve one MPS server at a time (its compute mode goes to EXCLUSIVE_PROCESS), so claims that
share a GPU through MPS share its daemon: the daemon of a set of GPUs is started by the first claim
prepared on exactly that set and stopped (compute mode back to DEFAULT) when the last one is
unprepared. Each claim's own limits reach its containers as the MPS client variables
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) in its CDI spec; the daemon's
defaults are the node's (its sharing.mps replicas) or the whole GPU.

The daemons are `nvdp.mps.supervisor.ResourceDaemon`s, as the MPS control-daemon DaemonSet runs them in
device-plugin mode: same start-up checks, probes, restarts, status file and readiness marker, under
`<MPS root>/<driver>/<name>/`, their clients' /dev/shm at `<MPS root>/<driver>/shm`. They run in the DRA
plugin's container, so a prepare waits for its daemon to answer and fails with the daemon's own error
when it does not.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from msgspec import Struct

from nvdp.inventory.model import Inventory
from nvdp.mps.commands import MpsGpu, MpsSettings
from nvdp.mps.compute_mode import ComputeModes
from nvdp.mps.paths import ResourcePaths
from nvdp.mps.supervisor import DEFAULT_PROBE_INTERVAL_S, ResourceDaemon
from nvdp.recording import Recorder

# Where a claim's containers find the daemon's pipe directory, as NVIDIA's DRA driver mounts it.
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
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
                 node_replicas: Mapping[str, int], modes_factory: Callable[[], ComputeModes],
                 log: logging.Logger, recorder: Recorder, ready_wait_s: float = READY_WAIT_S,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S) -> None:
        self.root = root  # the MPS root as this container sees it
        self.host_root = host_root.rstrip("/") or "/"  # the same on the node, for the CDI mounts
        self.driver = driver
        self.inventory = inventory
        self.node_replicas = dict(node_replicas)
        self._modes_factory = modes_factory
        self._modes: ComputeModes | None = None
        self.log = log
        self.recorder = recorder
        self.ready_wait_s = ready_wait_s
        self.probe_interval_s = probe_interval_s
        self._lock = threading.Lock()
        self._daemons: dict[tuple[str, ...], ResourceDaemon] = {}
        self._users: dict[tuple[str, ...], set[str]] = {}

    def users(self) -> dict[tuple[str, ...], frozenset[str]]:
        """The claims using each running daemon, by its GPUs."""
        with self._lock:
            return {gpus: frozenset(uids) for gpus, uids in self._users.items()}

    def use(self, claim_uid: str, gpus: Sequence[str]) -> MpsMount:
        """Start or join the daemon of `gpus` for the claim, waiting until it answers."""
        key = self._key(gpus)
        with self._lock:
            for other, uids in self._users.items():
                if other != key and set(other) & set(key) and uids - {claim_uid}:
                    raise MpsUnavailable(
                        f"GPU(s) {', '.join(sorted(set(other) & set(key)))} already run an MPS daemon for "
                        f"the GPU set {', '.join(other)} (claims {', '.join(sorted(uids))}); one GPU serves "
                        "one MPS daemon: claims sharing a GPU through MPS must ask for the same GPUs")
            daemon = self._daemons.get(key)
            if daemon is None:
                daemon = self._start(key)
            self._users.setdefault(key, set()).add(claim_uid)
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
        """The claim no longer uses MPS; its daemon stops when no other claim does."""
        with self._lock:
            emptied = []
            for key, uids in self._users.items():
                uids.discard(claim_uid)
                if not uids:
                    emptied.append(key)
            stopping = []
            for key in emptied:
                del self._users[key]
                daemon = self._daemons.pop(key, None)
                if daemon is not None:
                    stopping.append(daemon)
        for daemon in stopping:
            self.log.info("%s: no claim uses it any more; stopping it", daemon.name)
            if not daemon.stop():
                self.log.error("%s: the compute mode of %s could not be restored to DEFAULT", daemon.name,
                               ", ".join(daemon.uuids))

    def adopt(self, claim_uid: str, gpus: Sequence[str]) -> None:
        """At start-up: a claim prepared before a restart uses MPS on `gpus`; start its daemon again
        (not waited for: the claim's pods reconnect once it answers)."""
        key = self._key(gpus)
        with self._lock:
            if key not in self._daemons:
                self._start(key)
            self._users.setdefault(key, set()).add(claim_uid)

    def stop(self) -> bool:
        """Stop every daemon (shut-down) and clean up the node as the MPS control daemon does on its
        final stop: pipe folders and markers go, and the clients' tmpfs this pod mounted is detached
        (pods still using it keep it; the next start mounts a fresh one). False when a compute mode
        stayed changed."""
        from nvdp.mps.host_setup import clean_up

        with self._lock:
            daemons = list(self._daemons.values())
            self._daemons.clear()
            self._users.clear()
        restored = True
        for daemon in daemons:
            restored = daemon.stop() and restored
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
        gpus = []
        for ordinal, uuid in enumerate(key):
            gpu = self.inventory.gpu(uuid)
            assert gpu is not None  # _key checked
            gpus.append(MpsGpu(uuid=gpu.uuid, index=gpu.index, ordinal=ordinal, name=gpu.name,
                               memory_bytes=gpu.memory_bytes, compute_capability=gpu.compute_capability,
                               replicas=max(1, self.node_replicas.get(uuid, 1))))
        return MpsSettings(resource_name=daemon_name(self.driver, key), gpus=tuple(gpus))

    def _start(self, key: tuple[str, ...]) -> ResourceDaemon:
        if self._modes is None:
            self._modes = self._modes_factory()
        settings = self._settings(key)
        daemon = ResourceDaemon(settings, ResourcePaths(self.root, settings.resource_name), self._modes,
                                self.log, self.probe_interval_s, recorder=self.recorder)
        self.log.info("Starting the MPS control daemon %s", settings.describe())
        daemon.start()
        self._daemons[key] = daemon
        return daemon

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

