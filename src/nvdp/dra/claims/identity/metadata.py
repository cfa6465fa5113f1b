"""The device metadata file of each prepared request (KEP-5304), as Kubernetes' DRA helper writes it.

Format and container path are those of `k8s.io/dynamic-resource-allocation` (`api/metadata/types.go`
and `helpers.go`, `kubeletplugin/metadata.go`): a JSON stream of one `DeviceMetadata` object per API
version, newest first (`metadata.resource.k8s.io/v1beta1`, then `v1alpha1`, which Kubernetes 1.36
readers take), each naming the claim, its generation (1, then one more at every rewrite) and the
request's devices with their attributes in the slice's form. A container finds it at

    /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json

or, for a claim made from a template, under `resourceclaimtemplates/<its name in the pod>/` (the
claim's `resource.kubernetes.io/pod-claim-name` annotation). The claim's own CDI spec mounts it
(nvdp.cdi.claim). On the host it lives in the plugin's folder, one folder per claim UID (the helper
uses `<namespace>_<name>`; by UID a claim re-created under the same name never meets the old one's).

Pure: the file's bytes and paths; nvdp.dra.claims.cdi_specs writes them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from msgspec import Struct

from nvdp.dra.pool.devices import Attributes

API_VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
KIND = "DeviceMetadata"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
# Below the plugin's folder on the host, as the helper names it; then <claim uid>/<request>/FILE_NAME.
HOST_SUBDIR = "dra-device-metadata"
FILE_NAME = "metadata.json"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


class MetadataDevice(Struct, frozen=True):
    pool: str
    name: str
    attributes: Attributes


class ClaimFile(Struct, frozen=True):
    """One request's metadata file: its bytes, and where its containers find it."""

    request: str  # the base request: the folder of the file, and its CDI device
    container_path: str
    content: bytes


def pod_claim_name(claim: Mapping[str, Any]) -> str:
    """The claim's name in its pod when a template made it ("" for a claim the pod names directly)."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(POD_CLAIM_NAME_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else ""


def container_path(driver: str, claim_name: str, pod_claim: str, request: str) -> str:
    """Where a container finds the request's file (metadata.ResourceClaimFilePath and
    ResourceClaimTemplateFilePath)."""
    folder = posixpath.join(TEMPLATES_SUBDIR, pod_claim) if pod_claim else posixpath.join(CLAIMS_SUBDIR,
                                                                                          claim_name)
    return posixpath.join(CONTAINER_DIR, folder, request, driver + FILE_SUFFIX)


def host_path(root: str, claim_uid: str, request: str) -> str:
    """The file on the host: `<plugin folder>/dra-device-metadata/<claim uid>/<request>/metadata.json`."""
    return posixpath.join(root, claim_uid, request, FILE_NAME)


def metadata_stream(driver: str, *, namespace: str, name: str, uid: str, pod_claim: str, generation: int,
                    request_ref: str, devices: Sequence[MetadataDevice]) -> bytes:
    """One request's file: the same `DeviceMetadata` once per API version, newest first, each object
    on its own and ended by a newline (the helper's JSON stream)."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": generation},
    }
    if pod_claim:
        body["podClaimName"] = pod_claim
    body["requests"] = [{"name": request_ref, "devices": [
        {"driver": driver, "pool": d.pool, "name": d.name, "attributes": d.attributes} for d in devices]}]
    return b"".join(msgspec.json.encode({"kind": KIND, "apiVersion": version, **body}) + b"\n"
                    for version in API_VERSIONS)


def claim_files(driver: str, *, namespace: str, name: str, uid: str, pod_claim: str, generation: int,
                requests: Mapping[str, tuple[str, Sequence[MetadataDevice]]]) -> tuple[ClaimFile, ...]:
    """Every request's file; `requests`: by base request name, the request as allocated ("gpus" or
    "gpus/large") and its devices."""
    return tuple(
        ClaimFile(request=request, container_path=container_path(driver, name, pod_claim, request),
                  content=metadata_stream(driver, namespace=namespace, name=name, uid=uid,
                                          pod_claim=pod_claim, generation=generation, request_ref=ref,
                                          devices=devices))
        for request, (ref, devices) in requests.items())
