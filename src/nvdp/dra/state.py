"""Prepared claims: NodePrepareResources and NodeUnprepareResources, with the checkpoint and CDI specs.

One `ClaimPreparer` per process holds what is prepared on this node. Each call runs under a thread
lock and a file lock (`pu.lock` in the plugin's folder, so a second plugin instance during a rolling
update waits its turn), and follows the order that keeps a crash at any point recoverable:

1. a claim already prepared answers its stored devices (the kubelet retries, and asks again after it
   restarts), re-writing its CDI spec when the file is gone (a reboot empties /var/run/cdi);
2. the claim is read from the API server and checked (`claims.check_claim`), and no device may be held
   by another prepared claim or be unhealthy;
3. the claim's sharing is worked out (its and its classes' GpuConfig, else the node's sharing config);
   a device another prepared claim holds is refused unless the scheduler shared it (a replica of a
   shared GPU, with a share ID), and claims on one GPU must agree on MPS. A device allocated for admin
   access (KEP-5018: monitoring and debug pods) is prepared beside the claim holding it, holds
   nothing itself and takes no part in the GPU's sharing (no interval set, no MPS daemon joined);
4. the checkpoint records `PrepareStarted`, the sharing is applied (time slice, MPS daemon), the CDI
   spec is written with the sharing's edits, then `PrepareCompleted` with the claim's share.

Unprepare removes the spec and the entry and leaves the claim's MPS daemon (stopped with its last
claim); a claim this plugin never prepared is a no-op (logged): the
kubelet retries a failed unprepare forever and keeps the pod from terminating, and nothing is held.
At start (`restore`) the checkpoint's claims are checked with the API server: one it answers is gone
is released. A checkpoint that cannot be read is set aside (kept) and the prepared claims are rebuilt
from the claims the API server says are allocated on this node and reserved for a pod. Claim specs
no prepared claim owns are removed only when the API server's answer shows their claim is not in use
(nvdp.dra.rebuild); an unreachable API server or an unreadable claim removes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from msgspec import Struct
from msgspec.structs import replace

from nvdp.cdi.spec import ContainerEdits
from nvdp.dra.causes import API_ERROR, CDI_WRITE, DEVICE_BUSY, DEVICE_UNHEALTHY, LOCK_ACQUIRE, cause_of
from nvdp.dra.checkpoint import ClaimEntry, load_checkpoint, save_checkpoint
from nvdp.dra.claims import Allocated, ClaimProblem, check_claim, describe
from nvdp.dra.devices import DraDevice
from nvdp.dra.instances import ClaimInstances, MadeInstance
from nvdp.dra.lock import node_lock
from nvdp.dra.rebuild import (
    holders_on,
    in_use_here,
    list_claims_at_start,
    release_gone,
    remove_orphaned_specs,
)
from nvdp.dra.server import ClaimRef, PreparedDevice, PrepareResult
from nvdp.dra.sharing import ClaimShare, NodeSharing
from nvdp.dra.taints import Taint, tolerated
from nvdp.inventory.model import MigDevice
from nvdp.kube.claims import UnreadableClaim

STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"
# The kubelet gives a call 45 s; a plugin that cannot get the node-wide lock in this long answers the
# claim with an error (retried) rather than running into the kubelet's deadline.
LOCK_WAIT_S = 10.0

GetClaim = Callable[[str, str], "Mapping[str, Any] | None"]
ListClaims = Callable[[], "Sequence[Mapping[str, Any]]"]  # a ClaimListing says which it could not read


class ClaimSpecs(Protocol):
    """The per-claim CDI specs on disk."""

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None,
              made: Mapping[str, MigDevice] | None = None) -> dict[str, str]:
        """Write the claim's spec (`extra`: edits for all its containers; `made`: the MIG devices made
        for its placement devices, by device name); the qualified CDI name of each device, by name."""

    def remove(self, claim_uid: str) -> None: ...

    def exists(self, claim_uid: str) -> bool: ...

    def present(self) -> frozenset[str]:
        """The claim UIDs that have a spec file."""


class NodeView(Struct, frozen=True):
    """What the node has now: its devices by name, and the UUIDs that are unhealthy."""

    devices: Mapping[str, DraDevice]
    unhealthy: frozenset[str] = frozenset()
    # The taints each published device carries (nvdp.dra.taints), by name; empty while taints are not
    # published (an API server without them): an unhealthy device is then refused to every claim.
    taints: Mapping[str, tuple[Taint, ...]] = {}

    def unhealthy_device(self, name: str) -> bool:
        device = self.devices[name]
        return device.uuid in self.unhealthy or device.gpu_uuid in self.unhealthy

    def refused(self, result: Allocated) -> bool:
        """An unhealthy device is refused unless the claim tolerates every taint it is published with
        (a diagnostics pod on the faulted GPU)."""
        if not self.unhealthy_device(result.device):
            return False
        taints = self.taints.get(result.device, ())
        return not taints or not tolerated(result.tolerations, taints)


class ClaimPreparer:
    def __init__(self, *, driver: str, pool: str, checkpoint_path: str, lock_path: str, specs: ClaimSpecs,
                 get_claim: GetClaim, view: Callable[[], NodeView], log: logging.Logger,
                 sharing: NodeSharing | None = None, instances: ClaimInstances | None = None) -> None:
        self.driver = driver
        self._instances = instances or ClaimInstances(None, log)
        self._sharing = sharing or NodeSharing(driver=driver, mps=None, log=log,
                                               no_mps_reason="this plugin was started without MPS")
        self.pool = pool
        self._path = checkpoint_path
        self._lock_path = lock_path
        self._specs = specs
        self._get_claim = get_claim
        self._view = view
        self._log = log
        self._lock = threading.Lock()
        self._claims: dict[str, ClaimEntry] = {}

    # --- start ---------------------------------------------------------------------------------

    def restore(self, list_claims: ListClaims | None) -> str | None:
        """Load the checkpoint, release its claims the API server says are gone; when it was unreadable,
        rebuild from `list_claims()`. Then remove the claim specs proven orphaned (nvdp.dra.rebuild).
        Returns the checkpoint problem, if any."""
        with self._locked():
            loaded = load_checkpoint(self._path)
            self._claims = dict(loaded.claims)
            if loaded.problem is not None:
                self._log.error("%s", loaded.problem)
            for uid, entry in list(self._claims.items()):
                if entry.state == STARTED:  # a crash between the two writes: nothing was handed out
                    self._log.info("Rolling back %s, left half prepared", describe(entry.namespace,
                                                                                   entry.name, uid))
                    self._specs.remove(uid)
                    left = self._instances.destroy(entry.instances)
                    if left:
                        self._log.error("Cannot destroy the MIG devices of %s: %s", uid, left)
                    else:
                        del self._claims[uid]
            self._release_gone()
            listed = None
            if list_claims is not None and (loaded.problem is not None or self._stray_specs()):
                listed = list_claims_at_start(list_claims, self._log)
                if listed is not None and loaded.problem is not None:
                    self._rebuild(listed.claims)
            for uid, entry in self._claims.items():
                self._sharing.adopt(uid, entry.share)
            remove_orphaned_specs(self._specs, self._stray_specs(), listed, self._log)
            self._save()
            self._log.info("Prepared claims on this node: %d", len(self._claims))
            return loaded.problem

    def _release_gone(self, uids: Sequence[str] | None = None) -> bool:
        """Release the prepared claims (all, or `uids`) the API server answers are gone; True if any."""
        def release(uid: str) -> None:
            entry = self._claims.get(uid)
            left = self._instances.destroy(entry.instances) if entry is not None else ""
            if left:
                raise RuntimeError(left)
            self._specs.remove(uid)
            self._sharing.release(uid)

        if not release_gone(self._claims, list(self._claims) if uids is None else uids,
                            get_claim=self._get_claim, release=release, log=self._log):
            return False
        self._save()
        return True

    def _stray_specs(self) -> frozenset[str]:
        return self._specs.present() - self._claims.keys()

    def _rebuild(self, claims: Sequence[Mapping[str, Any]]) -> None:
        view = self._view()
        for claim in claims:
            meta = claim.get("metadata") or {}
            uid, namespace, name = meta.get("uid", ""), meta.get("namespace", ""), meta.get("name", "")
            results = in_use_here(claim, driver=self.driver, pool=self.pool, devices=view.devices.keys())
            if not results or uid in self._claims:
                continue
            try:
                share = self._sharing.share_of(claim, view.devices, self._claimed(results, view))
                devices = self._write_spec(uid, results, view, self._sharing.edits(share))
            except Exception as err:
                self._log.error("Cannot rebuild %s: %s", describe(namespace, name, uid), err)
                continue
            self._claims[uid] = ClaimEntry(uid=uid, namespace=namespace, name=name, state=COMPLETED,
                                           devices=devices, share=share)
            self._log.info("Rebuilt %s from the API server", describe(namespace, name, uid))

    def _refuse_unless_holders_gone(self, claim_uid: str, what: str, results: Sequence[Allocated],
                                    view: NodeView, share: ClaimShare) -> None:
        """The held-or-unhealthy check; when it refuses, the prepared claims on the claim's GPUs are read
        from the API server (a start that could not reach it kept them), those it answers are gone are
        released, and the check runs again."""
        try:
            self._refuse_held_or_unhealthy(claim_uid, what, results, view, share)
        except ClaimProblem:
            gpus = {view.devices[r.device].gpu_uuid for r in results if not r.admin_access}
            if not self._release_gone(holders_on(gpus, self._claims, view.devices, but=claim_uid)):
                raise
            self._refuse_held_or_unhealthy(claim_uid, what, results, view, share)

    def _read_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return self._get_claim(namespace, name)
        except UnreadableClaim as err:  # stored by the API server, beyond what nvdp decodes
            raise ClaimProblem(f"cannot prepare {err}; correct that field (a claim's spec cannot change: "
                               "create the claim again)") from None

    # --- the kubelet's calls -------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        answers: dict[str, PrepareResult] = {}
        try:
            with self._locked():
                for ref in refs:
                    answers[ref.uid] = self._prepare_one(ref)
        except TimeoutError as err:
            for ref in refs:
                answers.setdefault(ref.uid, PrepareResult(error=str(err), cause=LOCK_ACQUIRE))
        return answers

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        answers: dict[str, str] = {}
        try:
            with self._locked():
                for ref in refs:
                    answers[ref.uid] = self._unprepare_one(ref)
        except TimeoutError as err:
            for ref in refs:
                answers.setdefault(ref.uid, str(err))
        return answers

    def prepared(self) -> Mapping[str, ClaimEntry]:
        return dict(self._claims)

    # --- one claim -----------------------------------------------------------------------------

    def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        what = describe(ref.namespace, ref.name, ref.uid)
        entry = self._claims.get(ref.uid)
        if entry is not None and entry.state == COMPLETED:
            try:
                remade = self._remade(entry, what)
            except ClaimProblem as err:
                return PrepareResult(error=str(err), cause=err.cause)
            if remade is not entry or not self._specs.exists(ref.uid):  # a reboot emptied the spec folder
                self._log.info("Writing the CDI spec of %s again (its file is gone)", what)
                self._specs.write(ref.uid, self._devices_of(remade), self._sharing.edits(remade.share),
                                  _made(remade.instances))
            return PrepareResult(devices=remade.devices)
        view = self._view()
        try:
            claim = self._read_claim(ref.namespace, ref.name)
            results = check_claim(claim, namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                  driver=self.driver, pool=self.pool, devices=view.devices.keys())
            assert claim is not None  # check_claim refuses a missing claim
            share = self._sharing.share_of(claim, view.devices, self._claimed(results, view))
            self._refuse_unless_holders_gone(ref.uid, what, results, view, share)
        except ClaimProblem as err:
            self._log.warning("Not preparing: %s", err)
            return PrepareResult(error=str(err), cause=err.cause)
        except Exception as err:  # the API server: unreachable, refused, timed out
            self._log.warning("Cannot read %s from the API server: %s", what, err)
            return PrepareResult(error=f"cannot read {what} from the API server: {err}; the kubelet retries",
                                 cause=API_ERROR)
        started = ClaimEntry(uid=ref.uid, namespace=ref.namespace, name=ref.name, state=STARTED)
        self._claims[ref.uid] = started
        self._save()
        try:
            extra = self._sharing.apply(ref.uid, share)
            made = self._instances.make(what, self._claimed(results, view), (),
                                        lambda now: self._record(ref.uid, now))
            devices = self._write_spec(ref.uid, results, view, extra, made)
        except Exception as err:
            self._specs.remove(ref.uid)
            self._sharing.release(ref.uid)
            left = self._instances.destroy(self._claims[ref.uid].instances)  # as recorded: all it made
            if left:  # kept: the start's rollback (or the kubelet's retry) destroys them
                self._log.error("Cannot destroy the MIG devices of %s after a failed prepare: %s", what, left)
            else:
                del self._claims[ref.uid]
            self._save()
            self._log.error("Cannot prepare %s: %s", what, err)
            text = str(err) if isinstance(err, ClaimProblem) else f"cannot prepare {what}: {err}"
            return PrepareResult(error=text, cause=cause_of(err, CDI_WRITE))
        started = self._claims[ref.uid]
        self._claims[ref.uid] = replace(started, state=COMPLETED, devices=devices, share=share)
        self._instances.report(ref.namespace, ref.name, self.driver, self.pool, started.instances)
        self._save()
        self._log.info("Prepared %s: %s", what, ", ".join(f"{d.device} -> {', '.join(d.cdi_ids)}"
                                                           for d in devices) or "no device of this driver")
        return PrepareResult(devices=devices)

    def _refuse_held_or_unhealthy(self, claim_uid: str, what: str, results: Sequence[Allocated],
                                  view: NodeView, share: ClaimShare) -> None:
        # A device given for admin access (KEP-5018) is prepared beside whichever claim holds it, and
        # neither holds nor shares it: it is left out of both checks, on this claim's side and on others'.
        mine = {view.devices[r.device].gpu_uuid for r in results if not r.admin_access}
        for result in results:
            if view.refused(result):
                raise ClaimProblem(f"{what}: device {result.device} is unhealthy and the claim does not "
                                   "tolerate its taints; delete the pod to have the claim allocated "
                                   "elsewhere", DEVICE_UNHEALTHY)
            if result.admin_access:
                continue
            # A replica of a shared GPU: the scheduler gave it to several claims, each with a share ID.
            shared = view.devices[result.device].shared and bool(result.share_id)
            for uid, other in self._claims.items():
                if uid != claim_uid and not shared and any(d.device == result.device and not d.admin_access
                                                           for d in other.devices):
                    raise ClaimProblem(
                        f"{what}: device {result.device} is already prepared for "
                        f"{describe(other.namespace, other.name, uid)}; two claims were allocated the same "
                        "device (a scheduler race, or a claim deleted while this plugin was down): it is "
                        "handed out again once that claim is unprepared", DEVICE_BUSY)
        for uid, other in self._claims.items():
            theirs = {view.devices[d.device].gpu_uuid for d in other.devices
                      if d.device in view.devices and not d.admin_access}
            both = sorted(mine & theirs)
            if uid == claim_uid or not both or other.share.mps_gpus == share.mps_gpus:
                continue
            how = (f"through the MPS daemon of {', '.join(other.share.mps_gpus)}" if other.share.uses_mps
                   else "without MPS")
            asks = f"MPS on {', '.join(share.mps_gpus)}" if share.uses_mps else "no MPS"
            raise ClaimProblem(
                f"{what}: GPU {', '.join(both)} is in use by {describe(other.namespace, other.name, uid)} "
                f"{how}, and this claim asks for {asks}; claims that share a GPU must share it the same way "
                "(the same MPS GPUs, or no MPS): give them the same sharing config; this claim is prepared "
                "once that one is unprepared", DEVICE_BUSY)

    def _claimed(self, results: Sequence[Allocated], view: NodeView) -> list[DraDevice]:
        """The devices whose sharing the claim takes part in: an admin-access device gets none (no
        time slice set, no MPS daemon joined), so it is never counted as a user of the holder's GPU."""
        return [view.devices[name] for name in dict.fromkeys(r.device for r in results if not r.admin_access)]

    def _write_spec(self, uid: str, results: Sequence[Allocated], view: NodeView,
                    extra: ContainerEdits | None = None, made: Sequence[MadeInstance] = ()
                    ) -> tuple[PreparedDevice, ...]:
        unique = list(dict.fromkeys(r.device for r in results))
        names = (self._specs.write(uid, [view.devices[d] for d in unique], extra, _made(made))
                 if unique else {})
        return tuple(PreparedDevice(request_names=(r.request,), pool=r.pool, device=r.device,
                                    cdi_ids=(names[r.device],), admin_access=r.admin_access)
                     for r in results)

    def _devices_of(self, entry: ClaimEntry) -> list[DraDevice]:
        view = self._view()
        names = dict.fromkeys(d.device for d in entry.devices)
        missing = [n for n in names if n not in view.devices]
        if missing:
            raise ClaimProblem(f"{describe(entry.namespace, entry.name, entry.uid)}: device(s) "
                               f"{', '.join(missing)} are no longer on this node")
        return [view.devices[n] for n in names]

    def _record(self, uid: str, made: tuple[MadeInstance, ...]) -> None:
        """The MIG devices made for a claim so far, saved at once: the checkpoint owns them."""
        self._claims[uid] = replace(self._claims[uid], instances=made)
        self._save()

    def _remade(self, entry: ClaimEntry, what: str) -> ClaimEntry:
        """A prepared claim whose MIG devices are gone (a reboot) gets them made again; else `entry`."""
        if not entry.instances:
            return entry
        devices = [d for d in self._devices_of(entry) if d.placement is not None]
        made = self._instances.make(what, devices, entry.instances, lambda now: self._record(entry.uid, now))
        if made == entry.instances:
            return entry
        self._claims[entry.uid] = replace(self._claims[entry.uid], instances=made)
        self._save()
        return self._claims[entry.uid]

    def _unprepare_one(self, ref: ClaimRef) -> str:
        what = describe(ref.namespace, ref.name, ref.uid)
        entry = self._claims.pop(ref.uid, None)
        if entry is not None and entry.instances:
            left = self._instances.destroy(entry.instances)
            if left:
                self._claims[ref.uid] = entry
                return f"cannot destroy the MIG devices of {what}: {left}; the kubelet retries"
        if entry is None:
            self._log.warning("Unprepare of %s, which this plugin has not prepared: nothing to undo", what)
            self._specs.remove(ref.uid)  # a spec left by a crash, if any
            return ""
        try:
            self._specs.remove(ref.uid)
        except Exception as err:
            self._claims[ref.uid] = entry
            return f"cannot remove the CDI spec of {what}: {err}; the kubelet retries"
        self._save()
        self._sharing.release(ref.uid)
        self._log.info("Unprepared %s", what)
        return ""

    # --- locks and the file ----------------------------------------------------------------------

    def _save(self) -> None:
        save_checkpoint(self._path, self._claims)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return node_lock(self._lock, self._lock_path, LOCK_WAIT_S)


def _made(made: Sequence[MadeInstance]) -> dict[str, MigDevice]:
    return {m.device: m.mig for m in made}
