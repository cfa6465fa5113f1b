"""Prepared claims: NodePrepareResources and NodeUnprepareResources as one transaction per claim.

One `ClaimPreparer` per process holds what is prepared on this node (its `ClaimBook`, saved to the
checkpoint at every change). Each call runs under a thread lock and a file lock (`pu.lock` in the
plugin's folder, so a second plugin instance during a rolling update waits its turn):

1. a claim already prepared answers its stored devices (the kubelet retries, and asks again after it
   restarts), making again a MIG device that is gone and re-writing its CDI spec when the file is gone
   (a reboot empties /var/run/cdi and MIG devices); a claim left half prepared or half released is
   first undone;
2. the claim is read from the API server and checked (`check.check_claim`); no device may overlap one
   another prepared claim holds (nvdp.dra.claims.holders: by what each occupies on its GPU, whatever
   the allocation says) or be unhealthy; claims on one GPU must agree on MPS. A holder is released
   first when it is proven gone (nvdp.dra.claims.release); a refusal names both claims;
3. the entry is recorded `PrepareStarted`, then the sharing is applied (time slice, MPS daemon), the
   MIG devices made (nvdp.dra.claims.mig: each NVML call between its intent and its result), the
   requests' device metadata files and the CDI spec written with the sharing's edits and the files'
   mounts; then `PrepareCompleted`, and the claim's status.devices (nvdp.dra.claims.identity: what
   each device is, one computation for both). A GPU whose health changes has the metadata files of the
   claims on it written again (`catch_up`).

Any failure runs the claim's one undo (nvdp.dra.claims.undo), and so does unprepare. A claim this
plugin never prepared is a no-op at unprepare (logged): the kubelet retries a failed unprepare
forever and keeps the pod from terminating, and nothing is held. The start (`restore`,
nvdp.dra.claims.release) replays the record before the plugin serves.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from msgspec.structs import replace

from nvdp.cdi.claim import claim_file_id
from nvdp.cdi.spec import ContainerEdits
from nvdp.dra.claims.book import ClaimBook, node_lock
from nvdp.dra.claims.causes import API_ERROR, CDI_WRITE, DEVICE_BUSY, DEVICE_UNHEALTHY, LOCK_ACQUIRE, cause_of
from nvdp.dra.claims.check import Allocated, ClaimProblem, ClaimSpecs, NodeView, check_claim, describe
from nvdp.dra.claims.holders import holders_on, overlapping
from nvdp.dra.claims.identity.claim import health_changed, request_files, status_entries
from nvdp.dra.claims.identity.metadata import pod_claim_name
from nvdp.dra.claims.identity.status import ClaimStatus, StatusWriter
from nvdp.dra.claims.mig import ClaimInstances
from nvdp.dra.claims.records import (
    COMPLETED,
    STARTED,
    ClaimEntry,
    ClaimRef,
    MigDeviceStep,
    PreparedDevice,
    PrepareResult,
    Step,
)
from nvdp.dra.claims.release import ClaimsInUse, Releaser
from nvdp.dra.claims.sharing.node import ClaimShare, NodeSharing
from nvdp.dra.claims.undo import ClaimUndo
from nvdp.dra.pool.devices import DraDevice
from nvdp.inventory.model import MigDevice
from nvdp.kube.claims import UnreadableClaim

# The kubelet gives a call 45 s; a plugin that cannot get the node-wide lock in this long answers the
# claim with an error (retried) rather than running into the kubelet's deadline. Calls queue for the
# lock when many pods start at once: at 10 s, 10 claim pods created together on the kit's node had some
# prepares refused and retried after the kubelet's back-off (84.6 s until the tenth was Ready).
LOCK_WAIT_S = 30.0
CATCH_UP_WAIT_S = 0.5

GetClaim = Callable[[str, str], "Mapping[str, Any] | None"]
ListClaims = Callable[[], "Sequence[Mapping[str, Any]]"]  # a ClaimListing says which it could not read


class ClaimPreparer:
    def __init__(self, *, driver: str, pool: str, checkpoint_path: str, lock_path: str, specs: ClaimSpecs,
                 get_claim: GetClaim, view: Callable[[], NodeView], log: logging.Logger,
                 sharing: NodeSharing | None = None, instances: ClaimInstances | None = None,
                 in_use: ClaimsInUse | None = None, status: StatusWriter | None = None) -> None:
        self.driver = driver
        self.pool = pool
        self._instances = instances or ClaimInstances(None, log)
        self._status = ClaimStatus(status, log)
        # The unhealthy UUIDs the claims' metadata files were last written for (None: not known since
        # the start, when the files of claims on GPUs that are down are written again).
        self._health_written: frozenset[str] | None = None
        self._sharing = sharing or NodeSharing(driver=driver, mps=None, log=log,
                                               no_mps_reason="this plugin was started without MPS")
        self._lock_path = lock_path
        self._specs = specs
        self._get_claim = get_claim
        self._view = view
        self._log = log
        self._lock = threading.Lock()
        self._book = ClaimBook(checkpoint_path)
        self._undo = ClaimUndo(self._instances, specs, self._sharing, log)
        self._release = Releaser(book=self._book, undo=self._undo, specs=specs, sharing=self._sharing,
                                 get_claim=lambda ns, name: self._get_claim(ns, name), in_use=in_use,
                                 log=log, driver=driver, pool=pool,
                                 view=view, write_spec=self._write_spec)

    # --- start and catching up -----------------------------------------------------------------

    def restore(self, list_claims: ListClaims | None) -> str | None:
        """Replay the checkpoint before serving (nvdp.dra.claims.release.Releaser.restore): claims left
        half prepared or half released are undone, claims proven gone released, a lost checkpoint
        rebuilt from the API server. Returns the checkpoint problem, if any."""
        with self._locked():
            problem = self._release.restore(list_claims)
            self._report_pending()
            return problem

    def catch_up(self) -> None:
        """What a start could not do because the API server did not answer (the rebuild of a lost
        checkpoint, claim status writes), tried again; nothing, and no lock, when nothing waits. The
        daemon's tick calls it: it waits for the node lock a moment only, as a prepare that holds it
        catches up itself."""
        waiting = self._release.rebuild_pending or any(
            e.status_pending for e in self._book.entries().values())
        if not waiting and self._view().unhealthy == (self._health_written or frozenset()):
            return
        try:
            with node_lock(self._lock, self._lock_path, CATCH_UP_WAIT_S):
                self._follow()
                self._release.retry_rebuild()
                self._report_pending()
                self._rewrite_for_health()
        except TimeoutError:
            pass

    def _report_pending(self) -> None:
        for uid in self._book:
            entry = self._book[uid]
            if entry.state == COMPLETED and entry.status_pending and self._status.report(
                    entry.namespace, entry.name, status_entries(self.driver, entry, self._view().devices)):
                self._book.put(replace(entry, status_pending=False))

    def _rewrite_for_health(self) -> None:
        """The metadata files of the prepared claims whose GPUs' health changed since they were written,
        written again (the next generation); a failure is logged, and tried again at the next change."""
        view = self._view()
        if view.unhealthy == self._health_written:
            return
        changed = (self._health_written or frozenset()) ^ view.unhealthy
        for uid, entry in self._book.entries().items():
            if entry.state != COMPLETED or not health_changed(entry, view, changed):
                continue
            now = replace(entry, metadata_generation=max(1, entry.metadata_generation) + 1)
            try:
                self._specs.write(uid, self._devices_of(now), self._sharing.edits(now.share),
                                  _made(now.steps), request_files(self.driver, now, view))
            except Exception as err:
                self._log.warning("Cannot write the device metadata of %s again: %s",
                                  describe(entry.namespace, entry.name, uid), err)
                continue
            self._book.put(now)
        self._health_written = view.unhealthy

    # --- the kubelet's calls -------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        answers: dict[str, PrepareResult] = {}
        try:
            with self._locked():
                self._release.retry_rebuild()
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
        return self._book.entries()

    # --- one claim -----------------------------------------------------------------------------

    def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        what = describe(ref.namespace, ref.name, ref.uid)
        entry = self._book.get(ref.uid)
        if entry is not None and entry.state == COMPLETED:
            try:
                return PrepareResult(devices=self._answer_prepared(entry, what))
            except ClaimProblem as err:
                return PrepareResult(error=str(err), cause=err.cause)
        if entry is not None:  # left half prepared or half released: undone before it starts again
            left = self._undo(entry, self._book.saver(ref.uid), self._book.others(ref.uid))
            if left:
                return PrepareResult(error=f"{what}: cannot undo its earlier, unfinished prepare: {left}; "
                                     "the kubelet retries", cause=CDI_WRITE)
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
        self._book.put(ClaimEntry(uid=ref.uid, namespace=ref.namespace, name=ref.name, state=STARTED,
                                  share=share, pod_claim_name=pod_claim_name(claim), metadata_generation=1))
        try:
            extra = self._sharing.apply(ref.uid, share)
            steps = self._instances.make(what, self._claimed(results, view), (), self._recorder(ref.uid))
            devices = self._write_spec(replace(self._book[ref.uid], steps=steps), results, view, extra)
        except Exception as err:
            entry = self._book[ref.uid]
            left = self._undo(entry, self._book.saver(ref.uid), self._book.others(ref.uid))
            if left:  # kept Releasing: the kubelet's retry or the next start finishes the undo
                self._log.error("Cannot undo the failed prepare of %s: %s", what, left)
            self._log.error("Cannot prepare %s: %s", what, err)
            text = str(err) if isinstance(err, ClaimProblem) else f"cannot prepare {what}: {err}"
            return PrepareResult(error=text, cause=cause_of(err, CDI_WRITE))
        entry = replace(self._book[ref.uid], state=COMPLETED, devices=devices, share=share,
                        status_pending=True)
        self._book.put(entry)
        self._report_pending()
        self._log.info("Prepared %s: %s", what, ", ".join(f"{d.device} -> {', '.join(d.cdi_ids)}"
                                                           for d in devices) or "no device of this driver")
        return PrepareResult(devices=devices)

    def _answer_prepared(self, entry: ClaimEntry, what: str) -> tuple[PreparedDevice, ...]:
        """A prepared claim's devices again; a MIG device that is gone (a reboot, an admin) is made
        again, its status entry rewritten, and the spec written again when the device changed or the
        file is gone (a reboot empties the spec folder)."""
        now = entry
        if entry.made:
            devices = [d for d in self._devices_of(entry) if d.placement is not None]
            steps = self._instances.make(what, devices, entry.steps, self._recorder(entry.uid))
            if steps != entry.steps:
                now = replace(self._book[entry.uid], steps=steps, status_pending=True)
                self._book.put(now)
        if now is not entry or not self._specs.exists(entry.uid):
            self._log.info("Writing the CDI spec of %s again (%s)", what,
                           "its MIG device was made again" if now is not entry else "its file is gone")
            self._specs.write(entry.uid, self._devices_of(now), self._sharing.edits(now.share),
                              _made(now.steps), request_files(self.driver, now, self._view()))
        self._report_pending()
        return now.devices

    def _unprepare_one(self, ref: ClaimRef) -> str:
        what = describe(ref.namespace, ref.name, ref.uid)
        entry = self._book.get(ref.uid)
        if entry is None:
            self._log.warning("Unprepare of %s, which this plugin has not prepared: nothing to undo", what)
            self._specs.remove(ref.uid)  # a spec left by a crash, if any
            return ""
        left = self._undo(entry, self._book.saver(ref.uid), self._book.others(ref.uid))
        if left:
            return f"cannot release {what}: {left}; the kubelet retries"
        self._log.info("Unprepared %s", what)
        return ""

    def _recorder(self, uid: str) -> Callable[[tuple[Step, ...]], None]:
        def record(steps: tuple[Step, ...]) -> None:
            self._book.put(replace(self._book[uid], steps=steps))
        return record

    def _read_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return self._get_claim(namespace, name)
        except UnreadableClaim as err:  # stored by the API server, beyond what nvdp decodes
            raise ClaimProblem(f"cannot prepare {err}; correct that field (a claim's spec cannot change: "
                               "create the claim again)") from None

    # --- who holds what --------------------------------------------------------------------------

    def _refuse_unless_holders_gone(self, claim_uid: str, what: str, results: Sequence[Allocated],
                                    view: NodeView, share: ClaimShare) -> None:
        """The held-or-unhealthy check; when it refuses, the prepared claims in the way are released
        if proven gone (nvdp.dra.claims.release: the API server and the kubelet agree), and the check
        runs again."""
        try:
            self._refuse_held_or_unhealthy(claim_uid, what, results, view, share)
        except ClaimProblem:
            gpus = {view.devices[r.device].gpu_uuid for r in results if not r.admin_access}
            holders = holders_on(gpus, self._book.entries(), view.devices, but=claim_uid)
            if not self._release.release_proven_gone(holders):
                raise
            self._refuse_held_or_unhealthy(claim_uid, what, results, view, share)

    def _refuse_held_or_unhealthy(self, claim_uid: str, what: str, results: Sequence[Allocated],
                                  view: NodeView, share: ClaimShare) -> None:
        # A device given for admin access (KEP-5018) is prepared beside whichever claim holds it, and
        # neither holds nor shares it: it is left out of both checks, on this claim's side and on others'.
        for result in results:
            if view.refused(result):
                raise ClaimProblem(f"{what}: device {result.device} is unhealthy and the claim does not "
                                   "tolerate its taints; delete the pod to have the claim allocated "
                                   "elsewhere", DEVICE_UNHEALTHY)
        wanted = [(r.device, view.devices[r.device].shared and bool(r.share_id))
                  for r in results if not r.admin_access]
        for held in overlapping(claim_uid, wanted, view.devices, self._book.entries()):
            other = self._book[held.claim_uid]
            how = ("is already prepared for" if held.held == held.device
                   else f"overlaps device {held.held} (the same GPU, or its memory slices), prepared for")
            raise ClaimProblem(
                f"{what}: device {held.device} {how} {describe(other.namespace, other.name, other.uid)}; "
                "two claims were allocated what one device can hold (a scheduler race, a forged "
                "allocation, or a claim deleted while its pod still runs): it is handed out once that "
                "claim is unprepared", DEVICE_BUSY)
        mine = {view.devices[r.device].gpu_uuid for r in results if not r.admin_access}
        for uid, other in self._book.entries().items():
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

    def _write_spec(self, entry: ClaimEntry, results: Sequence[Allocated], view: NodeView,
                    extra: ContainerEdits | None = None) -> tuple[PreparedDevice, ...]:
        """The claim's metadata files and CDI spec written (`entry`: the claim with its sharing and the
        MIG devices made for it); its devices as the kubelet gets them. The first device of each
        request also names the request's metadata file: the kubelet gives a container the CDI devices
        of every device of the requests it uses."""
        uid = entry.uid
        prepared = tuple(PreparedDevice(request_names=(r.request,), pool=r.pool, device=r.device, cdi_ids=(),
                                        admin_access=r.admin_access, share_id=r.share_id,
                                        subrequest=r.subrequest) for r in results)
        files = request_files(self.driver, replace(entry, devices=prepared), view)
        unique = list(dict.fromkeys(r.device for r in results))
        names = (self._specs.write(uid, [view.devices[d] for d in unique], extra, _made(entry.steps), files)
                 if unique else {})
        mounted = {f.request for f in files}
        answer = []
        for p in prepared:
            request = p.request_names[0]
            file_ids = (claim_file_id(uid, request),) if request in mounted else ()
            mounted.discard(request)
            answer.append(replace(p, cdi_ids=(names[p.device], *file_ids)))
        return tuple(answer)

    def _devices_of(self, entry: ClaimEntry) -> list[DraDevice]:
        view = self._view()
        names = dict.fromkeys(d.device for d in entry.devices)
        missing = [n for n in names if n not in view.devices]
        if missing:
            raise ClaimProblem(f"{describe(entry.namespace, entry.name, entry.uid)}: device(s) "
                               f"{', '.join(missing)} are no longer on this node")
        return [view.devices[n] for n in names]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with node_lock(self._lock, self._lock_path, LOCK_WAIT_S):
            self._follow()
            yield

    def _follow(self) -> None:
        """Under the node lock: take over what another instance of this plugin (the old pod of a rolling
        update, which may finish calls after this one started) recorded since this one last looked."""
        if not self._book.changed_elsewhere():
            return
        added, dropped = self._book.reload()
        for uid in dropped:
            self._sharing.release(uid)  # the other instance undid it; its MPS order follows
        for uid in added:
            entry = self._book[uid]
            if entry.state == COMPLETED:
                self._sharing.adopt(uid, entry.share)
        if added or dropped:
            self._log.info("The checkpoint was changed by another instance of this plugin (a rolling "
                           "update): %d claim(s) prepared there, %d released there", len(added), len(dropped))


def _made(steps: Sequence[Step]) -> dict[str, MigDevice]:
    return {s.device: s.mig for s in steps if isinstance(s, MigDeviceStep) and s.mig is not None}
