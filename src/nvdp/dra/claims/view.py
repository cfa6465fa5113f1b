"""What the claim transaction reads of the node (its published devices, their health and taints) and
writes of it (the per-claim CDI specs), as the preparer and the start's replay see them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from msgspec import Struct

from nvdp.cdi.spec import ContainerEdits
from nvdp.dra.claims.check import Allocated
from nvdp.dra.pool.devices import DraDevice
from nvdp.dra.pool.taints import Taint, tolerated
from nvdp.inventory.model import MigDevice


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
