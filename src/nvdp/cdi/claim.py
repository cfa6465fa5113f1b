"""The CDI spec of one prepared ResourceClaim (DRA mode): its devices, named after the claim.

Pure. As NVIDIA's DRA driver does, each claim gets a transient spec of its own, vendor
`k8s.gpu.nvidia.com`, class `claim`, with one CDI device per DRA device named
`<claim uid>-<device name>` (`k8s.gpu.nvidia.com/claim=<uid>-gpu-0`): a name is never reused for
another claim, so a runtime that caches specs cannot hand out a stale one. A device's edits are the
device plugin's for the same GPU or MIG device, and the common edits are the driver's, with
`NVIDIA_VISIBLE_DEVICES=void` as NVIDIA writes it: the CDI devices carry the GPUs, and on a node whose
runtime is nvidia-container-runtime in legacy mode a device list there would have the runtime's hook
inject the same GPUs a second time.

A request's device metadata file (KEP-5304) is mounted by a CDI device of its own in the same spec,
`<claim uid>-metadata-<request>`: the kubelet hands it to the containers that use that request.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from nvdp.cdi.build import SpecBuilder, finish_spec
from nvdp.cdi.edits import join
from nvdp.cdi.facts import HostFacts
from nvdp.cdi.spec import ContainerEdits, Device, Mount, Spec, kind_of, qualified
from nvdp.config.model import Config
from nvdp.inventory.model import Gpu, Inventory, MigDevice

CLAIM_VENDOR = "k8s.gpu.nvidia.com"
CLAIM_CLASS = "claim"
CLAIM_KIND = kind_of(CLAIM_CLASS, CLAIM_VENDOR)
# Every DRA device name starts with this (nvdp.dra.pool.names: "gpu-<minor>", "gpu-<minor>-mig-...").
_DRA_NAME_START = "gpu-"
# A file for the containers to read, never to change, as the kubelet's own metadata mounts are.
FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")


class ClaimDevice(Struct, frozen=True):
    """One DRA device of a claim: its name ("gpu-0"), its GPU, and the MIG device when it is one."""

    name: str
    gpu: Gpu
    mig: MigDevice | None = None

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig is not None else self.gpu.uuid


class RequestFile(Struct, frozen=True):
    """A file one request of the claim mounts into its containers (its device metadata)."""

    request: str
    host_path: str
    container_path: str


def claim_file_name(claim_uid: str, request: str) -> str:
    """The CDI device name that mounts request `request`'s file: `<claim uid>-metadata-<request>`."""
    return f"{claim_uid}-metadata-{request}"


def claim_file_id(claim_uid: str, request: str) -> str:
    """Its qualified CDI name, which the kubelet passes for every device of that request."""
    return qualified(CLAIM_KIND, claim_file_name(claim_uid, request))


def claim_device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of DRA device `device` in claim `claim_uid`: `<claim uid>-<device>`."""
    return f"{claim_uid}-{device}"


def claim_spec(config: Config, inventory: Inventory, facts: HostFacts, claim_uid: str,
               devices: Sequence[ClaimDevice], extra: ContainerEdits | None = None,
               files: Sequence[RequestFile] = ()) -> Spec:
    """The claim's spec (CdiError when it would be invalid, e.g. no devices, naming the cause).

    `extra` joins the common edits: what the claim's sharing adds for all its containers (the MPS
    pipe and client limits). `files`: one CDI device each, mounting the file read-only."""
    builder = SpecBuilder(config, inventory, facts)
    unique = list({d.name: d for d in devices}.values())  # a device named twice is one CDI device
    cdi_devices = [
        Device(name=claim_device_name(claim_uid, d.name),
               container_edits=builder.gpu_edits(d.gpu) if d.mig is None else builder.mig_edits(d.gpu, d.mig))
        for d in unique
    ]
    cdi_devices += [
        Device(name=claim_file_name(claim_uid, f.request), container_edits=ContainerEdits(mounts=(
            Mount(host_path=f.host_path, container_path=f.container_path, options=FILE_MOUNT_OPTIONS),)))
        for f in {f.request: f for f in files}.values()
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
    """The qualified CDI name of each DRA device of a claim's spec, by DRA device name
    ({"gpu-0": "k8s.gpu.nvidia.com/claim=<uid>-gpu-0"}); the requests' file devices are not DRA devices."""
    named = {dra_device_name(d.name, claim_uid): qualified(spec.kind, d.name) for d in spec.devices}
    return {name: cdi for name, cdi in named.items() if name.startswith(_DRA_NAME_START)}
