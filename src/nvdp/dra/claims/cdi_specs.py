"""The per-claim files of the DRA driver: its CDI spec, made by `nvdp.cdi.claim` from the same driver
facts as the device plugin's specs, and its requests' device metadata files (KEP-5304,
nvdp.dra.claims.identity.metadata), which that spec mounts; written and removed together.

The host's driver files are read once per config (start and reload), not per claim: a prepare only
builds the claim's devices onto them, so NodePrepareResources reads no files but those it writes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence

from nvdp.cdi.claim import ClaimDevice, RequestFile, claim_cdi_ids, claim_spec
from nvdp.cdi.errors import CdiError
from nvdp.cdi.facts import HostFacts
from nvdp.cdi.spec import ContainerEdits
from nvdp.cdi.write import claim_spec_path, claim_spec_uids, remove_claim_spec, write_claim_spec, write_file
from nvdp.config.model import Config
from nvdp.dra.claims.identity.metadata import ClaimFile, host_path
from nvdp.dra.pool.devices import DraDevice
from nvdp.inventory.model import Inventory, MigDevice


class ClaimSpecWriter:
    """`ClaimSpecs` (nvdp.dra.claims.preparer) on a spec folder, for one config and inventory; the
    metadata files go below `metadata_root` (the plugin's folder on the host, `dra-device-metadata`)."""

    def __init__(self, directory: str, config: Config, inventory: Inventory, facts: HostFacts,
                 metadata_root: str = "") -> None:
        self.directory = directory
        self.metadata_root = metadata_root
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
              made: Mapping[str, MigDevice] | None = None, files: Sequence[ClaimFile] = ()) -> dict[str, str]:
        mounted = self._write_files(claim_uid, files)
        spec = claim_spec(self._config, self._inventory, self._facts, claim_uid,
                          [self._claim_device(d, made or {}) for d in devices], extra, mounted)
        write_claim_spec(self.directory, spec, claim_uid)
        return claim_cdi_ids(spec, claim_uid)

    def _write_files(self, claim_uid: str, files: Sequence[ClaimFile]) -> list[RequestFile]:
        if files and not self.metadata_root:
            raise CdiError("no folder for the claims' device metadata files is set")
        mounted = []
        for file in files:
            path = host_path(self.metadata_root, claim_uid, file.request)
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            write_file(file.content, path, fix=f"the plugin writes its claims' device metadata below "
                                                f"{self.metadata_root}: its folder on the host, writable")
            mounted.append(RequestFile(request=file.request, host_path=path,
                                       container_path=file.container_path))
        return mounted

    def remove(self, claim_uid: str) -> None:
        remove_claim_spec(self.directory, claim_uid)  # first: no container starts with what goes
        if self.metadata_root and claim_uid:
            shutil.rmtree(os.path.join(self.metadata_root, claim_uid), ignore_errors=True)

    def exists(self, claim_uid: str) -> bool:
        return os.path.exists(claim_spec_path(self.directory, claim_uid))

    def present(self) -> frozenset[str]:
        """The claim UIDs that have a spec file, or metadata files left without one."""
        try:
            folders = frozenset(os.listdir(self.metadata_root)) if self.metadata_root else frozenset()
        except OSError:
            folders = frozenset()
        return claim_spec_uids(self.directory) | folders


class CurrentSpecs:
    """The ClaimSpecs of whichever config is in force (a reload swaps the writer, not the preparer)."""

    def __init__(self, writer: Callable[[], ClaimSpecWriter]) -> None:
        self._writer = writer

    def write(self, claim_uid: str, devices: Sequence[DraDevice], extra: ContainerEdits | None = None,
              made: Mapping[str, MigDevice] | None = None, files: Sequence[ClaimFile] = ()) -> dict[str, str]:
        return self._writer().write(claim_uid, devices, extra, made, files)

    def remove(self, claim_uid: str) -> None:
        self._writer().remove(claim_uid)

    def exists(self, claim_uid: str) -> bool:
        return self._writer().exists(claim_uid)

    def present(self) -> frozenset[str]:
        return self._writer().present()
