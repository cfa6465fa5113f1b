"""Strict MPS shares: on a GPU whose `sharing.mps` entry sets `strictShares`, every claim has one share.

The GPU's slice offers one size (nvdp.dra.pool.slices: request policies with one valid value, one
replica and 1/N of the memory), so the scheduler allocates only that. Every claim on the GPU then has
the same MPS limits (nvdp.dra.claims.sharing.capacity), the daemon's ceiling, the largest limit among
its claims (nvdp.dra.claims.sharing.mps_limits), is that share, and MPS enforces each claim's limits
instead of leaving part of them to its containers' environment. A claim that would have other limits
there would undo that for every claim on the GPU, so it is refused at prepare: an allocation of another
size (written by hand, or by a scheduler that did not apply the request policy), a sharing config asking
other limits, or one asking TimeSlicing or no sharing (its containers would not be MPS clients at all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nvdp.dra.claims.causes import INVALID_CLAIM, INVALID_CONFIG
from nvdp.dra.claims.check import ClaimProblem, describe
from nvdp.dra.claims.records import ClaimShare
from nvdp.dra.claims.sharing.capacity import share_limits
from nvdp.dra.claims.sharing.gpuconfig import DeviceSharing, summary
from nvdp.dra.pool.devices import MIB, DraDevice
from nvdp.dra.pool.slices import REPLICAS_CAPACITY, share_capacity


def share_text(device: DraDevice) -> str:
    """The one share a strict GPU offers, for messages: "1/4 of the GPU (25% threads, 3840 MiB pinned)"."""
    limits = share_limits(device)
    memory = (f"{limits.pinned_memory_limit_mib} MiB pinned" if limits.pinned_memory_limit_mib is not None
              else "no memory limit")
    return f"1/{device.replicas} of the GPU ({limits.active_thread_percentage}% threads, {memory})"


def with_offered(claimed: Sequence[DraDevice], consumed: Mapping[str, Mapping[str, int]]
                 ) -> dict[str, Mapping[str, int]]:
    """The capacity allocated per device, a strict GPU's one share where the allocation does not say
    (an API server without consumable capacity records none): the only size such a GPU offers."""
    return {**{d.name: share_capacity(d) for d in claimed if d.strict}, **consumed}


def check_strict(claim: Mapping[str, Any], claimed: Sequence[DraDevice], sharing: Mapping[str, DeviceSharing],
                 consumed: Mapping[str, Mapping[str, int]], share: ClaimShare) -> None:
    """ClaimProblem naming the claim, what it asks and the GPU's share when the claim would have other
    MPS limits than its strict GPUs' share. `claimed`: the devices whose sharing the claim takes part in;
    `sharing`: each one's sharing with its allocated capacity applied; `consumed`: that capacity by
    device; `share`: the claim's share as its daemon and containers would get it."""
    strict = [d for d in claimed if d.strict]
    if not strict:
        return
    meta = claim.get("metadata") or {}
    what = describe(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))
    for device in strict:
        offered = share_capacity(device)
        taken = consumed.get(device.name)
        if taken is not None and any(offered.get(name) != amount for name, amount in taken.items()):
            raise ClaimProblem(
                f"{what} was allocated {_capacity_text(taken)} of {device.name}, whose GPU offers strict MPS "
                f"shares of {share_text(device)} only ({_capacity_text(offered)}): its slice allows no other "
                "size, so the allocation was written by hand or by a scheduler that did not apply the "
                "request policy; delete the claim (or the pod that made it) to have it allocated again",
                INVALID_CLAIM)
        got = sharing.get(device.name) or DeviceSharing()
        if got.strategy != "MPS":
            raise ClaimProblem(
                f"{what} asks for {summary(got)} on {device.name}, whose GPU offers strict MPS shares of "
                f"{share_text(device)} only, each held to its limits by MPS; remove that sharing config (the "
                "claim then gets the share), or ask for a GPU without strict shares", INVALID_CONFIG)
        if got.mps != share_limits(device):
            raise ClaimProblem(
                f"{what} asks for {summary(got)} on {device.name}, whose GPU offers strict MPS shares of "
                f"{share_text(device)} only: every claim on it has exactly that limit, which MPS enforces; "
                "remove the limits from the config (the claim then gets the share), set them to the share, "
                "or ask for a GPU without strict shares", INVALID_CONFIG)
    # The claim's containers have one thread share, the smallest of its devices' (claim_share).
    threads = share.mps_limits.thread_percentage
    for device in strict:
        wanted = share_limits(device).active_thread_percentage
        if threads != wanted:
            raise ClaimProblem(
                f"{what} would run with {threads if threads is not None else 100}% threads on all its GPUs "
                f"(a container has one thread share, the smallest its devices ask for), and {device.name} "
                f"offers strict MPS shares of {share_text(device)} only; put devices of different shares "
                "in separate claims", INVALID_CONFIG)


def _capacity_text(capacity: Mapping[str, int]) -> str:
    """ "1 replica and 3840 MiB of memory" """
    parts = []
    for name, amount in sorted(capacity.items(), key=lambda item: item[0] != REPLICAS_CAPACITY):
        if name == REPLICAS_CAPACITY:
            parts.append(f"{amount} replica{'s' if amount != 1 else ''}")
        elif name == "memory":
            mib = f"{amount // MIB}" if amount % MIB == 0 else f"{amount} bytes, {amount / MIB:.1f}"
            parts.append(f"{mib} MiB of memory")
        else:
            parts.append(f"{amount} of {name}")
    return " and ".join(parts)
