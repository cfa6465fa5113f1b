"""A ResourceClaim as the API server returns it -> the devices this driver must prepare on this node.

Pure: the claim comes in as a plain dict (the API object), the answer is a tuple of `Allocated` or a
`ClaimProblem` whose message says what is wrong and what happens next. The kubelet sends only the
claim's namespace, name and UID; the allocation is read from the claim itself, as every DRA driver
does, and the UID check catches a claim deleted and re-created under the same name in between.

`NodeView` is what the node has as a claim is checked (its published devices, their health and
taints); `ClaimSpecs` the per-claim CDI specs the transaction writes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from msgspec import Struct

from nvdp.cdi.spec import ContainerEdits
from nvdp.claim_results import allocation_results
from nvdp.dra.claims.causes import CLAIM_NOT_FOUND, INVALID_CLAIM
from nvdp.dra.claims.identity.metadata import ClaimFile
from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.taints import Taint, Toleration, tolerated, tolerations_of
from nvdp.inventory.model import MigDevice


class ClaimProblem(Exception):
    """The claim cannot be prepared; the message names the claim, the cause and what to do, and
    `cause` is one of nvdp.dra.claims.causes' words (a metric label)."""

    def __init__(self, message: str, cause: str = INVALID_CLAIM) -> None:
        super().__init__(message)
        self.cause = cause


class Allocated(Struct, frozen=True):
    """One allocation result of this driver: which request asked, and which device of which pool."""

    request: str  # the request's name, a subrequest suffix stripped ("gpus", not "gpus/large")
    pool: str
    device: str
    admin_access: bool = False
    # Set by the scheduler when the device allows multiple allocations (a shared GPU's replicas):
    # this claim's share, one of several claims holding the device.
    share_id: str = ""
    # The request's tolerations the scheduler took into account for a tainted device (KEP-5055).
    tolerations: tuple[Toleration, ...] = ()
    subrequest: str = ""  # "large" of "gpus/large": the request's alternative that was allocated


def describe(namespace: str, name: str, uid: str) -> str:
    return f"claim {namespace}/{name} (uid {uid})"


def our_results(claim: Mapping[str, Any], driver: str) -> tuple[Allocated, ...]:
    """The allocation results naming `driver`, in the order the scheduler wrote them; a claim can mix
    drivers, and the others' results are theirs to prepare."""
    found = []
    for _, result in allocation_results(claim):
        if result.get("driver") != driver:
            continue
        request, _, subrequest = str(result.get("request", "")).partition("/")
        found.append(Allocated(
            request=request,
            subrequest=subrequest,
            pool=str(result.get("pool", "")),
            device=str(result.get("device", "")),
            admin_access=bool(result.get("adminAccess") or False),
            share_id=str(result.get("shareID") or ""),
            tolerations=tolerations_of(result),
        ))
    return tuple(found)


def check_claim(claim: Mapping[str, Any] | None, *, namespace: str, name: str, uid: str, driver: str,
                pool: str, devices: Collection[str]) -> tuple[Allocated, ...]:
    """This driver's results of the claim the kubelet named, each on this node's pool and one of its
    `devices`; ClaimProblem otherwise. A claim with no result for this driver prepares nothing."""
    what = describe(namespace, name, uid)
    if claim is None:
        raise ClaimProblem(f"{what} is not in the API server (deleted?); the kubelet retries while the pod "
                           "still needs it", CLAIM_NOT_FOUND)
    found_uid = (claim.get("metadata") or {}).get("uid", "")
    if found_uid != uid:
        raise ClaimProblem(f"{what} was replaced: the API server has uid {found_uid} under that name; "
                           "the pod that asked for the old claim must be re-created", CLAIM_NOT_FOUND)
    if not (claim.get("status") or {}).get("allocation"):
        raise ClaimProblem(f"{what} is not allocated yet (no status.allocation); the scheduler allocates "
                           "it before the pod is bound, so the kubelet's retry should find it")
    results = our_results(claim, driver)
    for result in results:
        if result.pool != pool:
            raise ClaimProblem(
                f"{what}: request {result.request!r} was allocated device {result.device} of pool "
                f"{result.pool!r}, but this node's pool is {pool!r}; the pod was bound to the wrong node "
                "or the node was renamed: delete the pod so that the claim is allocated again")
        if result.device not in devices:
            known = ", ".join(sorted(devices)) or "none"
            raise ClaimProblem(
                f"{what}: request {result.request!r} was allocated device {result.device}, which this node "
                f"does not have (its devices: {known}); the node's ResourceSlice was out of date: delete "
                "the pod so that the claim is allocated again from the current slice")
    return results


class ClaimSpecs(Protocol):
    """The per-claim CDI specs on disk."""

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None,
              made: Mapping[str, MigDevice] | None = None, files: Sequence[ClaimFile] = ()) -> dict[str, str]:
        """Write the claim's files and then its spec (`extra`: edits for all its containers; `made`: the
        MIG devices made for its placement devices, by device name; `files`: its requests' metadata,
        each mounted by a CDI device of its own); the qualified CDI name of each device, by name."""

    def remove(self, claim_uid: str) -> None:
        """Remove the claim's spec, then its files."""

    def exists(self, claim_uid: str) -> bool: ...

    def present(self) -> frozenset[str]:
        """The claim UIDs that have a spec file (or files left without one)."""


class NodeView(Struct, frozen=True):
    """What the node has now: its devices by name, and the UUIDs that are unhealthy."""

    devices: Mapping[str, DraDevice]
    unhealthy: frozenset[str] = frozenset()
    # The taints each published device carries (nvdp.dra.pool.taints), by name; empty while taints are not
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
