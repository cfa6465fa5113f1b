"""What a starting DRA plugin keeps: the rules, as plain functions of what the API server answered, and
the start's steps that apply them (nvdp.dra.claims.release calls them).

At start the plugin has its checkpoint (or none it can trust), the claim specs on disk, and what the
API server says about claims. A spec is what a running pod's containers need to start again, so it is
removed only on facts: the API server answered, and its answer shows the claim is no longer in use on
this node (deleted, replaced by another claim of the same name, not allocated, or reserved for no pod).
A failed read (unreachable, refused, a claim that cannot be decoded) proves nothing, and keeps
everything it could have concerned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from msgspec import Struct

from nvdp.dra.claims.check import Allocated, our_results
from nvdp.kube.claims import ClaimListing


class SpecFiles(Protocol):
    def remove(self, claim_uid: str) -> None: ...


class Listed(Struct, frozen=True):
    """The API server's claims, and the UIDs of those it returned that could not be read ("" for one
    whose UID is unknown too)."""

    claims: Sequence[Mapping[str, Any]]
    unreadable_uids: frozenset[str] = frozenset()


def reserved_for_a_pod(claim: Mapping[str, Any]) -> bool:
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return any(isinstance(r, Mapping) and r.get("resource", "pods") == "pods" for r in reserved)


def released_because(claim: Mapping[str, Any] | None, *, uid: str) -> str | None:
    """Why the API server's answer for a claim prepared here (read by its namespace and name) shows it
    is no longer in use; None when it may be."""
    if claim is None:
        return "the API server has no such claim: it was deleted"
    found = str((claim.get("metadata") or {}).get("uid") or "")
    if found != uid:
        return f"the API server has another claim under its name (uid {found}): this one was deleted"
    if not (claim.get("status") or {}).get("allocation"):
        return "the API server has it no longer allocated"
    if not reserved_for_a_pod(claim):
        return "the API server has it reserved for no pod"
    return None


def in_use_here(claim: Mapping[str, Any], *, driver: str, pool: str, devices: Collection[str]
                ) -> tuple[Allocated, ...]:
    """The claim's results on this node's pool when a pod has it and all of them are this node's
    devices (a claim to prepare again after a lost checkpoint); () otherwise."""
    if not reserved_for_a_pod(claim):
        return ()
    results = tuple(r for r in our_results(claim, driver) if r.pool == pool)
    if any(r.device not in devices for r in results):
        return ()
    return results


def orphaned_specs(stray: Iterable[str], claims: Sequence[Mapping[str, Any]] | None,
                   unreadable_uids: Collection[str]) -> dict[str, str]:
    """Of the claim specs on disk that no prepared claim owns (`stray`, by claim UID), those proven
    orphaned, with the reason. `claims` is the API server's complete list (None: the list failed);
    `unreadable_uids` the UIDs of claims it returned that could not be decoded, "" for one whose UID
    is unknown too, which could be any claim and so proves no spec orphaned by absence."""
    if claims is None:
        return {}
    by_uid = {str((c.get("metadata") or {}).get("uid") or ""): c for c in claims}
    unknown = "" in unreadable_uids
    found: dict[str, str] = {}
    for uid in stray:
        claim = by_uid.get(uid)
        if claim is not None:
            reason = released_because(claim, uid=uid)
            if reason is not None:
                found[uid] = reason
        elif uid not in unreadable_uids and not unknown:
            found[uid] = "the API server has no claim with this UID: it was deleted"
    return found


def list_claims_at_start(list_claims: Callable[[], Sequence[Mapping[str, Any]]], log: logging.Logger
                         ) -> Listed | None:
    """What the API server lists (a ClaimListing says which claims it could not read); None, logged,
    when the list fails."""
    try:
        claims = list_claims()
    except Exception as err:  # the API server is away: nothing is known, nothing is removed
        log.error("Cannot list ResourceClaims (%s); the claim specs on this node are kept, running pods "
                  "keep their devices, new claims are prepared as asked", err)
        return None
    unreadable = claims.unreadable if isinstance(claims, ClaimListing) else ()
    for found in unreadable:
        log.error("Skipping a claim that cannot be read; a claim spec of this node that may be its is kept: "
                  "%s", found.problem)
    return Listed(claims, frozenset(u.uid for u in unreadable))


def remove_orphaned_specs(specs: SpecFiles, stray: frozenset[str], listed: Listed | None,
                          log: logging.Logger) -> None:
    """Remove the stray specs `orphaned_specs` proves orphaned; log the ones kept."""
    orphaned = orphaned_specs(stray, None if listed is None else listed.claims,
                              frozenset() if listed is None else listed.unreadable_uids)
    for uid, reason in sorted(orphaned.items()):
        log.info("Removing the CDI spec of claim %s, which is not prepared: %s", uid, reason)
        specs.remove(uid)
    if kept := sorted(stray - orphaned.keys()):
        log.warning("Keeping the CDI specs of claims %s: not prepared here, and the API server has not "
                    "shown them unused", ", ".join(kept))
