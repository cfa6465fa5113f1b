"""The CDI spec of one prepared ResourceClaim (DRA mode): its devices, named after the claim.

Pure. As NVIDIA's DRA driver does, each claim gets a transient spec of its own, vendor
`k8s.gpu.nvidia.com`, class `claim`, with one CDI device per DRA device named
`<claim uid>-<device name>` (`k8s.gpu.nvidia.com/claim=<uid>-gpu-0`): a name is never reused for
another claim, so a runtime that caches specs cannot hand out a stale one. A device's edits are the
device plugin's for the same GPU or MIG device, and the common edits are the driver's, with
`NVIDIA_VISIBLE_DEVICES=void` as NVIDIA writes it: the CDI devices carry the GPUs, and on a node whose
runtime is nvidia-container-runtime in legacy mode a device list there would have the runtime's hook
inject the same GPUs a second time.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from nvdp.cdi.build import SpecBuilder, finish_spec
from nvdp.cdi.edits import join
from nvdp.cdi.facts import HostFacts
from nvdp.cdi.spec import ContainerEdits, Device, Spec, kind_of, qualified
from nvdp.config.model import Config
from nvdp.inventory.model import Gpu, Inventory, MigDevice

CLAIM_VENDOR = "k8s.gpu.nvidia.com"
CLAIM_CLASS = "claim"
CLAIM_KIND = kind_of(CLAIM_CLASS, CLAIM_VENDOR)
# Every DRA device name starts with this (nvdp.dra.pool.names: "gpu-<minor>", "gpu-<minor>-mig-...").
_DRA_NAME_START = "gpu-"


class ClaimDevice(Struct, frozen=True):
    """One DRA device of a claim: its name ("gpu-0"), its GPU, and the MIG device when it is one."""

    name: str
    gpu: Gpu
    mig: MigDevice | None = None

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig is not None else self.gpu.uuid


def claim_device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of DRA device `device` in claim `claim_uid`: `<claim uid>-<device>`."""
    return f"{claim_uid}-{device}"


def claim_spec(config: Config, inventory: Inventory, facts: HostFacts, claim_uid: str,
               devices: Sequence[ClaimDevice], extra: ContainerEdits | None = None) -> Spec:
    """The claim's spec (CdiError when it would be invalid, e.g. no devices, naming the cause).

    `extra` joins the common edits: what the claim's sharing adds for all its containers (the MPS
    pipe and client limits)."""
    builder = SpecBuilder(config, inventory, facts)
    unique = list({d.name: d for d in devices}.values())  # a device named twice is one CDI device
    cdi_devices = [
        Device(name=claim_device_name(claim_uid, d.name),
               container_edits=builder.gpu_edits(d.gpu) if d.mig is None else builder.mig_edits(d.gpu, d.mig))
        for d in unique
    ]
    common = builder.common()  # NVIDIA_VISIBLE_DEVICES=void
    if extra is not None:
        common = join(common, extra)
    return finish_spec(CLAIM_KIND, cdi_devices, common)


def dra_device_name(cdi_device: str, claim_uid: str | None = None) -> str:
    """The DRA device name inside a claim's CDI device name.

    With the claim's uid the prefix is cut off exactly; without it, at the last "-gpu-", which works
    because every DRA device name starts with "gpu-" and has no "-gpu-" further on.
    """
    if claim_uid is not None and cdi_device.startswith(f"{claim_uid}-"):
        return cdi_device[len(claim_uid) + 1:]
    head, sep, tail = cdi_device.rpartition(f"-{_DRA_NAME_START}")
    return f"{_DRA_NAME_START}{tail}" if sep and head else cdi_device


def claim_cdi_ids(spec: Spec, claim_uid: str | None = None) -> dict[str, str]:
    """The qualified CDI name of each device of a claim's spec, by DRA device name
    ({"gpu-0": "k8s.gpu.nvidia.com/claim=<uid>-gpu-0"})."""
    return {dra_device_name(d.name, claim_uid): qualified(spec.kind, d.name) for d in spec.devices}
