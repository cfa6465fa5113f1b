"""The API server's version (`GET /version`, which every authenticated identity may read: the
system:public-info-viewer role), as text and as a comparable (major, minor, patch)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from lightkube import Client
from msgspec import Struct

# "v1.36.2", "v1.37.0-rc.1", "v1.36.2-gke.1000", "v1.36.2+k3s1".
_GIT_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")
# Managed control planes report minor "36+".
_NUMBER = re.compile(r"^(\d+)")


class ServerVersion(Struct, frozen=True):
    text: str  # the gitVersion as the server reports it, e.g. "v1.36.2"
    release: tuple[int, int, int] | None  # None: the server's answer names no version nvdp can read


def parse_version(info: Any) -> ServerVersion:
    """The /version answer ({"major": "1", "minor": "36", "gitVersion": "v1.36.2", ...}) as a
    ServerVersion: the gitVersion's numbers, else major and minor (patch 0)."""
    if not isinstance(info, dict):
        return ServerVersion(text=str(info)[:100], release=None)
    text = str(info.get("gitVersion") or "")
    found = _GIT_VERSION.match(text)
    if found:
        major, minor, patch = (int(g) for g in found.groups())
        return ServerVersion(text=text, release=(major, minor, patch))
    major_m = _NUMBER.match(str(info.get("major") or ""))
    minor_m = _NUMBER.match(str(info.get("minor") or ""))
    if major_m and minor_m:
        major, minor = int(major_m.group(1)), int(minor_m.group(1))
        return ServerVersion(text=text or f"{major}.{minor}", release=(major, minor, 0))
    return ServerVersion(text=text or "unknown", release=None)


def get_server_version(client: Client) -> ServerVersion:
    """GET /version through the client's own steps (address, credentials, timeouts); lightkube's
    ApiError for an HTTP error status, httpx's errors for a failed request."""
    from lightkube.core.generic_client import BasicRequest

    generic = client._client
    response = generic.send(generic.build_adapter_request(BasicRequest(method="GET", url="version")))
    generic.raise_for_status(response)  # type: ignore[no-untyped-call]  # ApiError, as lightkube raises
    try:
        info = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        return ServerVersion(text="not JSON", release=None)
    return parse_version(info)
