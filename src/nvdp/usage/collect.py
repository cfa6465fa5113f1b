"""One collection of the node's GPU usage by container: the edges read, `attribute` joins.

The same `UsageCollector.collect` answers the device plugin's and the DRA plugin's /metrics scrapes and
`nvdp usage`. Each is given what it counts: the device plugin the kubelet's device checkpoint (its
devices' holders), the DRA plugin its driver, the names of its devices and a way to read claims. A
collection with nothing held reads no NVML at all. Remembered between collections: the node's GPUs
(read again when NVML or a claim names a device they lack, at most every REFRESH_S), the pods each
claim is reserved for (read again for a claim with a new holder, or whose device runs a process of an
unknown pod), and each container's name.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from msgspec import Struct

from nvdp.daemon.podresources import POD_RESOURCES_SOCKET
from nvdp.inventory.model import Inventory
from nvdp.usage.attribute import attribute
from nvdp.usage.holders import (
    CHECKPOINT_FILE,
    CheckpointError,
    checkpoint_owners,
    claim_holders,
    claims_of,
    plugin_holders,
    reserved_pods,
)
from nvdp.usage.model import DeviceInfo, Holder, Usage
from nvdp.usage.procfs import ProcReader

# The node's GPUs and a claim's pods are read again at most this often.
REFRESH_S = 10.0
# The kubelet answers pod-resources List in milliseconds; a scrape's timeout is 10 s.
POD_RESOURCES_TIMEOUT_S = 3.0

ClaimReader = Callable[[str, str], Mapping[str, Any] | None]


class UsageSource(Struct, frozen=True):
    """Where a collection reads the node."""

    node: str
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    proc_root: str = "/proc"


class DraCounting(Struct, frozen=True):
    """What the DRA plugin counts: its driver's claims, its device names, the API's claims."""

    driver: str
    names: Callable[[Inventory], Mapping[str, str]]  # DRA device name -> GPU or MIG UUID
    read_claim: ClaimReader  # (namespace, name) -> the claim's JSON, None when deleted


def device_infos(inventory: Inventory) -> dict[str, DeviceInfo]:
    """Every GPU and MIG device of `inventory` as the series describe it."""
    infos: dict[str, DeviceInfo] = {}
    for gpu in inventory.gpus:
        infos[gpu.uuid] = DeviceInfo(gpu.uuid, gpu.uuid, gpu.index, gpu.minor, gpu.name)
        for mig in gpu.mig_devices:
            infos[mig.uuid] = DeviceInfo(mig.uuid, gpu.uuid, gpu.index, gpu.minor, gpu.name,
                                         mig_gi_id=mig.gi_id, mig_profile=mig.profile)
    return infos


def checkpoint_next_to(kubelet_socket: str | None) -> str | None:
    """The kubelet's device checkpoint beside its registration socket (None: nothing served)."""
    if not kubelet_socket:
        return None
    return os.path.join(os.path.dirname(kubelet_socket), CHECKPOINT_FILE)


def _nvml_session() -> AbstractContextManager[Any]:
    from nvdp.inventory.nvml import NvmlSession

    return NvmlSession()


def _discover() -> Inventory:
    from nvdp.inventory.nvml import discover

    return discover()


class UsageCollector:
    """Collects on demand; safe from any thread (one collection at a time)."""

    def __init__(self, source: UsageSource, *, checkpoint: Callable[[], str | None] | None = None,
                 dra: DraCounting | None = None,
                 nvml: Callable[[], AbstractContextManager[Any]] = _nvml_session,
                 discover: Callable[[], Inventory] = _discover, log: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self._checkpoint = checkpoint
        self._dra = dra
        self._nvml = nvml
        self._discover = discover
        self._log = log or logging.getLogger("nvdp.usage")
        self._clock = clock
        self._proc = ProcReader(source.proc_root)
        self._lock = threading.Lock()
        self._last: tuple[float, Usage] | None = None
        self._inventory: tuple[float, Inventory] | None = None
        self._claims: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
        self._stale: set[tuple[str, str]] = set()

    def collect(self) -> Usage:
        """A collection that began after this call: scrapes that come together (Prometheus' HA pair)
        share one, and none is answered with what was read before it was asked."""
        asked = self._clock()
        with self._lock:
            if self._last is not None and self._last[0] >= asked:
                return self._last[1]
            started = self._clock()
            usage = self._collect()
            self._last = (started, usage)
            return usage

    def _collect(self) -> Usage:
        from nvdp.daemon.podresources.client import PodResourcesUnavailable, container_holds
        from nvdp.inventory.nvml import NvmlUnavailable
        from nvdp.inventory.processes import read_processes

        node = self.source.node
        try:
            holds = container_holds(self.source.pod_resources_socket, POD_RESOURCES_TIMEOUT_S)
        except PodResourcesUnavailable as err:
            return Usage(node, problems=(str(err),))
        problems: list[str] = []
        path = self._checkpoint() if self._checkpoint is not None else None
        dp_held = path is not None and any(h.devices for h in holds)
        claims = claims_of(holds, self._dra.driver) if self._dra is not None else []
        if not dp_held and not claims:
            return Usage(node)  # nothing handed out: no NVML call
        try:
            with self._nvml():
                reading = read_processes()
        except NvmlUnavailable as err:
            return Usage(node, problems=(str(err),))
        problems.extend(f"cannot read the processes of {what}" for what in reading.unreadable)
        read = {d.uuid for d in reading.devices}
        holders: list[Holder] = []
        if dp_held and path is not None:
            holders.extend(plugin_holders(holds, read, self._device_owners(path, problems)))
        if self._dra is not None and claims:
            holders.extend(self._claim_holders(holds, claims, problems))
        infos = self._infos(read)
        unknown = [h for h in holders if not h.pod_uid]
        if unknown:
            problems.append("cannot tell the pod UID of " + ", ".join(
                sorted({f"{h.namespace}/{h.pod}" for h in unknown})) + "; their usage is left out")
        known = [h for h in holders if h.pod_uid]
        devices = [d for d in reading.devices if any(h.device == d.uuid for h in known)]
        owners = self._proc.owners(p.pid for d in devices for p in d.processes)
        uses, others = attribute(devices, infos, known, owners)
        # A claim's pods are read again when its device runs a process of a pod none of its holders is
        # (a pod made again under the same name, with a new UID, holding the same named claim).
        uids = {h.pod_uid for h in known}
        strangers = {d.uuid for d in devices for p in d.processes
                     if p.pid in owners and owners[p.pid].pod_uid not in uids}
        self._stale |= {(h.claim_namespace, h.claim_name) for h in known
                        if h.claim_name and h.device in strangers}
        return Usage(node, uses, others, tuple(problems))

    def _device_owners(self, path: str, problems: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
        try:
            with open(path, encoding="utf-8") as f:
                return checkpoint_owners(f.read(), path)
        except CheckpointError as err:
            problems.append(str(err))
        except OSError as err:
            problems.append(f"cannot read the kubelet's device checkpoint {path}: {err.strerror or err}; "
                            "mount the kubelet's device-plugins folder (the chart does)")
        return {}

    def _infos(self, uuids: set[str]) -> dict[str, DeviceInfo]:
        """The devices' descriptions (the node's GPUs read again where they lack one of `uuids`)."""
        inventory = self._current_inventory(uuids, set())
        return device_infos(inventory) if inventory is not None else {}

    def _current_inventory(self, uuids: set[str], names: set[str]) -> Inventory | None:
        """The node's GPUs, read again where they lack one of `uuids` or of the DRA device `names`, at
        most every REFRESH_S."""
        now = self._clock()
        held = self._inventory
        if held is not None:
            lacking = not uuids <= set(device_infos(held[1])) or (
                self._dra is not None and bool(names) and not names <= set(self._dra.names(held[1])))
            if not lacking or now - held[0] < REFRESH_S:
                return held[1]
        try:
            self._inventory = (now, self._discover())
        except Exception as err:  # NVML refused between two calls: keep what was read before
            self._log.warning("Usage: cannot read the node's GPUs: %s", err)
            return held[1] if held is not None else None
        return self._inventory[1]

    def _claim_holders(self, holds: Sequence[Any], claims: Sequence[tuple[str, str]],
                       problems: list[str]) -> list[Holder]:
        dra = self._dra
        assert dra is not None
        pods = self._claim_pods(holds, claims, problems)
        inventory = self._current_inventory(set(), set())
        names = dra.names(inventory) if inventory is not None else {}
        holders, unknown = claim_holders(holds, dra.driver, names, pods)
        if unknown:
            inventory = self._current_inventory(set(), unknown)
            names = dra.names(inventory) if inventory is not None else {}
            holders, unknown = claim_holders(holds, dra.driver, names, pods)
        if unknown:
            problems.append(f"no device of this node is named {', '.join(sorted(unknown))}; claims on them "
                            "are left out")
        return holders

    def _claim_pods(self, holds: Sequence[Any], claims: Sequence[tuple[str, str]],
                    problems: list[str]) -> dict[tuple[str, str], dict[str, str]]:
        """{pod name: UID} of each claim, read from the API for a claim not read yet or with a holder it
        does not name, and for one marked stale at most every REFRESH_S."""
        dra = self._dra
        assert dra is not None
        now = self._clock()
        held_by: dict[tuple[str, str], set[str]] = {}
        for hold in holds:
            for claim in hold.claims:
                held_by.setdefault((claim.namespace, claim.name), set()).add(hold.pod)
        kept: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
        for key in claims:
            cached = self._claims.get(key)
            if cached is not None and held_by.get(key, set()) <= set(cached[1]) and (
                    key not in self._stale or now - cached[0] < REFRESH_S):
                kept[key] = cached
                continue
            try:
                found = dra.read_claim(*key)
            except Exception as err:
                problems.append(f"cannot read ResourceClaim {key[0]}/{key[1]} for the pods it is reserved "
                                f"for: {err}")
                if cached is not None:
                    kept[key] = cached
                continue
            kept[key] = (now, reserved_pods(found) if found is not None else {})
            self._stale.discard(key)
        self._claims = kept
        return {key: pods for key, (_, pods) in kept.items()}
