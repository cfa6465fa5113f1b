"""The start's replay of the claim record, and the release of prepared claims only on proof.

At start, before the plugin serves (`restore`):
1. every claim the record shows half prepared (`PrepareStarted`) or half released (`Releasing`) is
   undone by the one undo (nvdp.dra.claims.undo): whatever step the plugin died at, what it began
   is found by what NVML says and removed, what it did not begin is never touched;
2. prepared claims proven gone are released (below);
3. a checkpoint that could not be read is rebuilt from the claims the API server lists as allocated
   on this node and reserved for a pod; when the API server does not answer, the rebuild is tried
   again at every prepare and every catch-up tick until it does (`retry_rebuild`), and the claim specs
   that no prepared claim owns are kept until then (nvdp.dra.claims.rebuild).

A prepared claim is released by the kubelet's NodeUnprepareResources, or when both say so:
- the API server: the claim is gone, replaced under its name, no longer allocated or reserved for
  no pod (nvdp.dra.claims.rebuild.released_because); and
- the kubelet's pod-resources API (`in_use`): no container of a pod on this node holds it. A claim
  force-deleted (finalizers removed) while its pod runs is gone from the API server, but its pod and
  its containers hold the GPU until they end; without this proof its device would be handed out twice.
A failed read of either proves nothing, and keeps the claim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from msgspec.structs import replace

from nvdp.dra.claims.book import ClaimBook
from nvdp.dra.claims.check import Allocated, NodeView, describe
from nvdp.dra.claims.identity.metadata import pod_claim_name
from nvdp.dra.claims.rebuild import (
    Listed,
    in_use_here,
    list_claims_at_start,
    released_because,
    remove_orphaned_specs,
)
from nvdp.dra.claims.records import COMPLETED, ClaimEntry, PreparedDevice
from nvdp.dra.claims.sharing.node import NodeSharing
from nvdp.dra.claims.undo import ClaimUndo
from nvdp.kube.claims import UnreadableClaim

if TYPE_CHECKING:
    from nvdp.cdi.spec import ContainerEdits

# The (namespace, name) of every claim a container of a pod on this node holds, from the kubelet's
# pod-resources API (nvdp.daemon.podresources.client); raises when the kubelet cannot say.
ClaimsInUse = Callable[[], Collection[tuple[str, str]]]


class SpecFiles(Protocol):
    def remove(self, claim_uid: str) -> None: ...

    def present(self) -> frozenset[str]: ...


class WriteSpec(Protocol):
    def __call__(self, entry: ClaimEntry, results: Sequence[Allocated], view: NodeView,
                 extra: ContainerEdits | None = None) -> tuple[PreparedDevice, ...]: ...


class Releaser:
    def __init__(self, *, book: ClaimBook, undo: ClaimUndo, specs: SpecFiles, sharing: NodeSharing,
                 get_claim: Callable[[str, str], Mapping[str, Any] | None], in_use: ClaimsInUse | None,
                 log: logging.Logger, driver: str, pool: str, view: Callable[[], NodeView],
                 write_spec: WriteSpec) -> None:
        self._book = book
        self._undo = undo
        self._specs = specs
        self._sharing = sharing
        self._get_claim = get_claim
        self._in_use = in_use
        self._log = log
        self._driver = driver
        self._pool = pool
        self._view = view
        self._write_spec = write_spec
        self._list_claims: Callable[[], Sequence[Mapping[str, Any]]] | None = None
        self._rebuild_pending = False
        self._retry_failed = False  # logged once per run of failed retries

    @property
    def rebuild_pending(self) -> bool:
        return self._rebuild_pending

    def restore(self, list_claims: Callable[[], Sequence[Mapping[str, Any]]] | None) -> str | None:
        loaded = self._book.load()
        if loaded.problem is not None:
            self._log.error("%s", loaded.problem)
        for uid in self._book:
            entry = self._book[uid]
            if entry.state == COMPLETED:
                continue
            what = describe(entry.namespace, entry.name, uid)
            self._log.info("Undoing what was done for %s, left %s", what,
                           "half prepared" if entry.state != "Releasing" else "half released")
            left = self._undo(entry, self._book.saver(uid), self._book.others(uid))
            if left:
                self._log.error("Cannot undo what was done for %s yet: %s", what, left)
        self.release_proven_gone(list(self._book))
        self._list_claims = list_claims
        self._rebuild_pending = loaded.problem is not None
        self._catch_up_specs(at_start=True)
        for uid, entry in self._book.entries().items():
            self._sharing.adopt(uid, entry.share)
        if not self._rebuild_pending:
            # Every prepared claim is known: what no claim uses goes (not before a lost checkpoint's
            # rebuild, which would stop the daemons of claims still to be found).
            self._sharing.settle()
        self._book.save()
        self._log.info("Prepared claims on this node: %d", len(self._book.entries()))
        return loaded.problem

    def retry_rebuild(self) -> None:
        """The rebuild of a checkpoint that could not be read, once the API server answers."""
        if self._rebuild_pending:
            self._catch_up_specs(at_start=False)

    def _catch_up_specs(self, *, at_start: bool) -> None:
        stray = self._specs.present() - set(self._book)
        if self._list_claims is None or not (self._rebuild_pending or stray):
            return
        listed = list_claims_at_start(self._list_claims, self._log) if at_start else self._list_quietly()
        if listed is not None and self._rebuild_pending:
            self._rebuild(listed.claims)
            self._rebuild_pending = False
            self._sharing.settle()
            self._log.info("Rebuilt the prepared claims from the API server: %d", len(self._book.entries()))
        remove_orphaned_specs(self._specs, self._specs.present() - set(self._book), listed, self._log)

    def _list_quietly(self) -> Listed | None:
        """The list for a retry: its failure is logged once, not at every tick."""
        assert self._list_claims is not None
        try:
            claims = self._list_claims()
        except Exception as err:
            if not self._retry_failed:
                self._log.warning("The prepared claims are still to be rebuilt from the API server, which "
                                  "does not answer (%s); tried again every tick, every claim spec kept", err)
            self._retry_failed = True
            return None
        self._retry_failed = False
        return list_claims_at_start(lambda: claims, self._log)

    def release_proven_gone(self, uids: Iterable[str]) -> bool:
        """Release the prepared claims among `uids` that the API server and the kubelet show unused
        (the module says how); whether any was released."""
        uids = [u for u in uids if u in self._book]
        if not uids or self._in_use is None:
            return False
        gone: list[tuple[str, str]] = []
        for uid in uids:
            entry = self._book[uid]
            try:
                claim = self._get_claim(entry.namespace, entry.name)
            except UnreadableClaim as err:
                self._log.warning("Keeping %s as prepared: %s",
                                  describe(entry.namespace, entry.name, uid), err)
                continue
            except Exception as err:
                self._log.warning("Cannot check the prepared claims with the API server (%s); keeping them "
                                  "as prepared", err)
                break
            reason = released_because(claim, uid=uid)
            if reason is not None:
                gone.append((uid, reason))
        if not gone:
            return False
        try:
            held = set(self._in_use())
        except Exception as err:
            self._log.warning("Keeping %s as prepared: the API server has them gone, but the kubelet cannot "
                              "say whether a container on this node still uses them (%s)",
                              ", ".join(uid for uid, _ in gone), err)
            return False
        released = False
        for uid, reason in gone:
            entry = self._book[uid]
            what = describe(entry.namespace, entry.name, uid)
            if (entry.namespace, entry.name) in held:
                self._log.warning("Keeping %s as prepared: %s, but a container on this node still holds it "
                                  "(its pod was not deleted with it); its devices are handed out again once "
                                  "that pod ends", what, reason)
                continue
            self._log.info("Releasing %s: %s, and no container on this node holds it", what, reason)
            left = self._undo(entry, self._book.saver(uid), self._book.others(uid))
            if left:
                self._log.error("Cannot release %s yet: %s", what, left)
                continue
            released = True
        return released

    def _rebuild(self, claims: Sequence[Mapping[str, Any]]) -> None:
        view = self._view()
        for claim in claims:
            meta = claim.get("metadata") or {}
            uid, namespace, name = meta.get("uid", ""), meta.get("namespace", ""), meta.get("name", "")
            results = in_use_here(claim, driver=self._driver, pool=self._pool, devices=view.devices.keys())
            if not results or uid in self._book:
                continue
            try:
                claimed = [view.devices[n]
                           for n in dict.fromkeys(r.device for r in results if not r.admin_access)]
                share = self._sharing.share_of(claim, view.devices, claimed)
                entry = ClaimEntry(uid=uid, namespace=namespace, name=name, state=COMPLETED, share=share,
                                   pod_claim_name=pod_claim_name(claim), metadata_generation=1)
                devices = self._write_spec(entry, results, view, self._sharing.edits(share))
            except Exception as err:
                self._log.error("Cannot rebuild %s: %s", describe(namespace, name, uid), err)
                continue
            self._book.put(replace(entry, devices=devices, status_pending=True))
            self._sharing.adopt(uid, share)
            self._log.info("Rebuilt %s from the API server", describe(namespace, name, uid))
