"""ResourceClaims (resource.k8s.io/v1) as plain dicts: read one, or list them all, each decoded on its own.

The API server stores claims whose opaque parameters nest thousands of levels deep; a JSON decoder
gives up on them. So responses are read as bytes, a list is cut into its items without recursion
(nvdp.kube.jsonshape), and each claim is decoded alone and only when it nests at most `MAX_DEPTH`
levels: one claim that cannot be read is reported by name, field and limit, never the list's failure.
"""

from __future__ import annotations

from typing import Any

import msgspec
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import GenericNamespacedResource, create_api_info
from msgspec import Struct

from nvdp.kube.jsonshape import NotJson, Path, field_name, outline

CLAIM_API_VERSION = "resource.k8s.io/v1"
# Far deeper than any claim a DRA driver reads (NVIDIA's GpuConfig sits 10 levels deep in a claim),
# far below where a decoder or Python itself gives up.
MAX_DEPTH = 100
LIST_PAGE = 500
# Fields holding free-form JSON: a path into them is named down to the field itself.
_FREE_FORM = frozenset({"parameters", "data", "fieldsV1"})
_NO_LIMIT = 1 << 30


class _ResourceClaim(GenericNamespacedResource):
    # Not registered with lightkube (see slices._ResourceSlice): the API's JSON kept whole.
    _api_info = create_api_info("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")


class Unreadable(Struct, frozen=True):
    """A claim the API server returned that is not decoded here; `problem` names it, the field and why."""

    namespace: str
    name: str
    uid: str  # "" when even its metadata cannot be read
    problem: str


class UnreadableClaim(ValueError):
    """get_claim's claim cannot be decoded; the message names the claim, the field and the limit."""

    def __init__(self, found: Unreadable) -> None:
        super().__init__(found.problem)
        self.found = found


class ClaimListing(list[dict[str, Any]]):
    """The claims that were read, and in `unreadable` those that were not (each reported, none lost
    silently). A list, so callers that only iterate claims need nothing else."""

    def __init__(self, claims: list[dict[str, Any]], unreadable: tuple[Unreadable, ...] = ()) -> None:
        super().__init__(claims)
        self.unreadable = unreadable


def get_claim(client: Client, namespace: str, name: str) -> dict[str, Any] | None:
    """The claim, or None when it does not exist (deleted); UnreadableClaim when it cannot be decoded."""
    try:
        body = _send(client, "get", name=name, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise
    found = decode_claim(body)
    if isinstance(found, Unreadable):
        raise UnreadableClaim(found)
    return found


def list_claims(client: Client) -> ClaimListing:
    """Every ResourceClaim in every namespace, page by page; a claim that cannot be decoded is left out
    and reported in `unreadable`. Errors of the requests themselves (unreachable, refused) raise."""
    claims: list[dict[str, Any]] = []
    unreadable: list[Unreadable] = []
    token = ""
    while True:
        params = {"limit": str(LIST_PAGE)} | ({"continue": token} if token else {})
        body = _send(client, "list", namespace="*", params=params)
        items, token = _list_parts(body)
        for raw in items:
            found = decode_claim(raw)
            if isinstance(found, Unreadable):
                unreadable.append(found)
            else:
                claims.append(found)
        if not token:
            return ClaimListing(claims, tuple(unreadable))


def decode_claim(raw: bytes) -> dict[str, Any] | Unreadable:
    """One claim's JSON -> the claim as a dict, or what keeps it from being read."""
    try:
        shape = outline(raw, MAX_DEPTH)
    except NotJson as err:
        return _unreadable({}, f"is not valid JSON ({err})")
    meta = _metadata(raw, shape.members.get("metadata"))
    if shape.too_deep_at is not None:
        return _unreadable(meta, f"{_field(shape.too_deep_at)} is nested more than {MAX_DEPTH} levels deep, "
                                 f"the most nvdp reads in a claim")
    try:
        claim = msgspec.json.decode(raw)
    except msgspec.DecodeError as err:
        return _unreadable(meta, f"is not valid JSON ({err})")
    if not isinstance(claim, dict):
        return _unreadable(meta, "is not a JSON object")
    claim.setdefault("apiVersion", CLAIM_API_VERSION)
    claim.setdefault("kind", "ResourceClaim")
    return claim


def _send(client: Client, method: str, *, namespace: str, name: str | None = None,
          params: dict[str, str] | None = None) -> bytes:
    """The response body of one request, undecoded. lightkube decodes whole responses, so the request
    is built and sent through its client's own steps (same address, credentials, timeouts)."""
    generic = client._client
    request = generic.prepare_request(method, _ResourceClaim, name=name, namespace=namespace, params=params)
    response = generic.send(generic.build_adapter_request(request))
    generic.raise_for_status(response)  # type: ignore[no-untyped-call]  # ApiError, as lightkube raises
    return bytes(response.content)


def _list_parts(body: bytes) -> tuple[list[bytes], str]:
    """A list response's items (raw, one by one) and its continue token."""
    try:
        shape = outline(body, _NO_LIMIT)
        items = shape.members.get("items")
        spans = outline(body[items[0]:items[1]], _NO_LIMIT).elements if items is not None else []
    except NotJson as err:
        raise ValueError(f"the API server's list of ResourceClaims is not valid JSON ({err})") from None
    base = items[0] if items is not None else 0
    meta = shape.members.get("metadata")
    listed = _metadata(body, meta)
    return [body[base + start:base + end] for start, end in spans], str(listed.get("continue") or "")


def _metadata(raw: bytes, span: tuple[int, int] | None) -> dict[str, Any]:
    if span is None:
        return {}
    try:
        meta = msgspec.json.decode(raw[span[0]:span[1]])
    except (msgspec.DecodeError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _unreadable(meta: dict[str, Any], why: str) -> Unreadable:
    namespace, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
    who = f"{namespace}/{name} (uid {uid})" if name else "with unreadable metadata"
    return Unreadable(namespace=namespace, name=name, uid=uid, problem=f"ResourceClaim {who}: {why}")


def _field(path: Path) -> str:
    """The field a too-deep path is in: down to the free-form field, else its first ten steps."""
    for i, part in enumerate(path):
        if part in _FREE_FORM:
            return field_name(path[:i + 1])
    return field_name(path[:10]) + (" (and below)" if len(path) > 10 else "")


def apply_device_status(client: Client, namespace: str, name: str, *, driver: str,
                        devices: list[dict[str, Any]]) -> None:
    """Set this driver's entries of a claim's `status.devices` (KEP-4817) by server-side apply, field
    manager `<driver>`: entries of other drivers are left as they are, and an empty `devices` removes
    this driver's. Each entry names `driver`, `pool`, `device` and carries `data` (free-form JSON).
    Raises lightkube's ApiError (404: the claim is gone)."""
    from lightkube.core.generic_client import BasicRequest

    generic = client._client
    body = {"apiVersion": CLAIM_API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "status": {"devices": devices}}
    request = BasicRequest(
        method="PATCH",
        url=f"apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status",
        params={"fieldManager": driver, "force": "true"}, data=body,
        headers={"Content-Type": "application/apply-patch+yaml"})
    response = generic.send(generic.build_adapter_request(request))
    generic.raise_for_status(response)  # type: ignore[no-untyped-call]
