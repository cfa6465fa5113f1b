"""ResourceClaims (resource.k8s.io/v1) as plain dicts: read one, or list them all."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import GenericNamespacedResource, create_api_info

CLAIM_API_VERSION = "resource.k8s.io/v1"


class _ResourceClaim(GenericNamespacedResource):
    # Not registered with lightkube (see slices._ResourceSlice): the API's JSON kept whole.
    _api_info = create_api_info("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")


def _plain(obj: Any) -> dict[str, Any]:
    found: dict[str, Any] = obj.to_dict()
    found.setdefault("apiVersion", CLAIM_API_VERSION)
    found.setdefault("kind", "ResourceClaim")
    return found


def get_claim(client: Client, namespace: str, name: str) -> dict[str, Any] | None:
    """The claim, or None when it does not exist (deleted)."""
    try:
        return _plain(client.get(_ResourceClaim, name=name, namespace=namespace))
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def list_claims(client: Client) -> list[dict[str, Any]]:
    """Every ResourceClaim in every namespace (to rebuild what is prepared after a lost checkpoint)."""
    return [_plain(obj) for obj in client.list(_ResourceClaim, namespace="*")]
