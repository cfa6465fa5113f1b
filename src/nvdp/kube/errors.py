"""What went wrong in an API call, as plain data: callers word it without importing the client library."""

from __future__ import annotations

import ssl
from typing import Any, Literal

from msgspec import Struct

FailureKind = Literal["status", "not-json", "tls", "timeout", "unreachable", "other"]


class ApiFailure(Struct, frozen=True):
    kind: FailureKind
    detail: str  # the error's own text
    code: int = 0  # the HTTP status, for kind "status"


def classify(err: BaseException) -> ApiFailure:
    """The kind of failure behind an exception raised by a call through `connect()`'s client."""
    import httpx2
    import msgspec
    from lightkube.core.exceptions import ApiError

    if isinstance(err, ApiError):
        return ApiFailure("status", err.status.message or err.status.reason or "", err.status.code or 0)
    if isinstance(err, (msgspec.DecodeError, ValueError)):
        return ApiFailure("not-json", str(err))
    cause = err.__cause__ or err.__context__
    if isinstance(err, ssl.SSLError) or isinstance(cause, ssl.SSLError) or "SSL" in str(err):
        return ApiFailure("tls", str(err))
    if isinstance(err, httpx2.TimeoutException):
        return ApiFailure("timeout", str(err))
    if isinstance(err, (httpx2.HTTPError, OSError)):
        return ApiFailure("unreachable", str(err))
    return ApiFailure("other", f"{type(err).__name__}: {err}")


def server_address(client: Any) -> str:
    """The API server's address a client talks to (for messages only)."""
    try:
        return str(client._client._client.base_url).rstrip("/")
    except AttributeError:
        return "the configured address"
