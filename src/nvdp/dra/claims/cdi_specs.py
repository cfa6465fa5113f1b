"""The per-claim CDI specs of the DRA driver: made by `nvdp.cdi.claim` from the same driver facts as the
device plugin's specs, written and removed through `nvdp.cdi.write`.

The host's driver files are read once per config (start and reload), not per claim: a prepare only
builds the claim's devices onto them, so NodePrepareResources reads no files but the spec it writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from nvdp.cdi.claim import ClaimDevice, claim_cdi_ids, claim_spec
from nvdp.cdi.facts import HostFacts
from nvdp.cdi.spec import ContainerEdits
from nvdp.cdi.write import claim_spec_path, claim_spec_uids, remove_claim_spec, write_claim_spec
from nvdp.config.model import Config
from nvdp.dra.pool.devices import DraDevice
from nvdp.inventory.model import Inventory, MigDevice


class ClaimSpecWriter:
    """`ClaimSpecs` (nvdp.dra.claims.preparer) on a spec folder, for one config and inventory."""

    def __init__(self, directory: str, config: Config, inventory: Inventory, facts: HostFacts) -> None:
        self.directory = directory
        self._config = config
        self._inventory = inventory
        self._facts = facts

    def _claim_device(self, device: DraDevice, made: Mapping[str, MigDevice]) -> ClaimDevice:
        gpu = self._inventory.gpu(device.gpu_uuid)
        if gpu is None:
            raise LookupError(f"device {device.name} ({device.uuid}) is not in the GPU inventory")
        mig = made.get(device.name)
        if mig is None and device.placement is not None:
            raise LookupError(f"device {device.name} is a MIG placement whose MIG device was not made")
        if mig is None and device.kind == "mig":
            mig = next((m for m in gpu.mig_devices if m.uuid == device.uuid), None)
        return ClaimDevice(name=device.name, gpu=gpu, mig=mig)

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None,
              made: Mapping[str, MigDevice] | None = None) -> dict[str, str]:
        spec = claim_spec(self._config, self._inventory, self._facts, claim_uid,
                          [self._claim_device(d, made or {}) for d in devices], extra)
        write_claim_spec(self.directory, spec, claim_uid)
        return claim_cdi_ids(spec, claim_uid)

    def remove(self, claim_uid: str) -> None:
        remove_claim_spec(self.directory, claim_uid)

    def exists(self, claim_uid: str) -> bool:
        return os.path.exists(claim_spec_path(self.directory, claim_uid))

    def present(self) -> frozenset[str]:
        return claim_spec_uids(self.directory)


class CurrentSpecs:
    """The ClaimSpecs of whichever config is in force (a reload swaps the writer, not the preparer)."""

    def __init__(self, writer: Callable[[], ClaimSpecWriter]) -> None:
        self._writer = writer

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None,
              made: Mapping[str, MigDevice] | None = None) -> dict[str, str]:
        return self._writer().write(claim_uid, devices, extra, made)

    def remove(self, claim_uid: str) -> None:
        self._writer().remove(claim_uid)

    def exists(self, claim_uid: str) -> bool:
        return self._writer().exists(claim_uid)

    def present(self) -> frozenset[str]:
        return self._writer().present()
