"""Typed errors of the Cantata SDK. Every one carries the server's request id."""

from __future__ import annotations

import grpc


class CantataError(Exception):
    """Base class of every SDK error."""

    def __init__(self, message: str, *, request_id: str = "", code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.code = code


class Unauthenticated(CantataError):
    """No valid client certificate (missing, another CA's, expired or revoked)."""


class PermissionDenied(CantataError):
    """Authenticated, but not allowed (wrong role, or the tenant is suspended)."""


class NotFound(CantataError):
    """No such object for this caller."""


class InvalidArgument(CantataError):
    """The request was malformed or too large."""


class InvalidJob(InvalidArgument):
    """A job that fails validation; ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str = "", **kwargs):
        super().__init__(message, **kwargs)
        self.field = field


class QuotaExceeded(CantataError):
    """A tenant limit is reached; ``what``, ``limit`` and ``used`` say which."""

    def __init__(self, message: str, *, what: str = "", limit: int = 0, used: int = 0, **kwargs):
        super().__init__(message, **kwargs)
        self.what, self.limit, self.used = what, limit, used


class Conflict(CantataError):
    """The object exists already or is in a state that forbids the action."""


class DataLoss(CantataError):
    """Stored data failed verification (a tampered or truncated checkpoint): nothing of it was used."""


class Unavailable(CantataError):
    """The server cannot be reached, or the TLS handshake failed."""


class StreamInterrupted(Unavailable):
    """An event or log stream ended before its terminal event."""


_BY_CODE = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
}


def from_rpc_error(err: grpc.RpcError) -> CantataError:
    """Map a gRPC error to the SDK's error tree."""
    code = err.code()
    trailers = dict(err.trailing_metadata() or ())
    request_id = trailers.get("cantata-request-id", "")
    kind = trailers.get("cantata-error", "")
    message = err.details() or code.name
    common = {"request_id": request_id, "code": code}
    if kind.startswith("invalid_job:"):
        return InvalidJob(message, field=kind.split(":", 1)[1], **common)
    if kind.startswith("quota_exceeded:"):
        _, what, limit, used = kind.split(":", 3)
        return QuotaExceeded(message, what=what, limit=int(limit), used=int(used), **common)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return InvalidArgument(f"request too large: {message}", **common)
    return _BY_CODE.get(code, CantataError)(message, **common)
