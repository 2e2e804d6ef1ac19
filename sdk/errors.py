"""Typed errors of the Cantata SDK. Every one carries the server's request id.

The server describes an error with ``google.rpc`` details: an ``ErrorInfo``
whose reason (``INVALID_JOB``, ``QUOTA_EXCEEDED``, ``NOT_FOUND``, ...) and
metadata say what happened, a ``BadRequest`` naming an invalid field, a
``QuotaFailure`` and the call's ``RequestInfo``.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from cantata.proto.vocabulary import ERROR_DOMAIN, REQUEST_ID_KEY, ErrorReason


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


class InvalidWebhook(InvalidArgument):
    """A webhook URL the server refuses: not https, too long, or reaching an address webhooks may not."""


class QuotaExceeded(CantataError):
    """A tenant limit is reached; ``what``, ``limit`` and ``used`` say which, and ``retry_after_s`` (when the
    server tells, as for login links; else 0) when to try again."""

    def __init__(
        self, message: str, *, what: str = "", limit: int = 0, used: int = 0, retry_after_s: float = 0.0, **kwargs
    ):
        super().__init__(message, **kwargs)
        self.what, self.limit, self.used, self.retry_after_s = what, limit, used, retry_after_s


class EnrollmentLimited(QuotaExceeded):
    """An anonymous enrollment limit (pending requests, or calls per address); retry after ``retry_after_s``."""


class Conflict(CantataError):
    """The object exists already or is in a state that forbids the action."""


class DataLoss(CantataError):
    """Stored data failed verification (a tampered or truncated checkpoint): nothing of it was used."""


class StoreFull(CantataError):
    """A checkpoint or dataset store has no space left; the error names the store."""


class Unavailable(CantataError):
    """The server cannot be reached, or the TLS handshake failed."""


class StreamInterrupted(Unavailable):
    """An event or log stream ended before its terminal event."""


class WaitTimedOut(CantataError):
    """``JobHandle.wait(timeout=...)`` ran out of time before the job ended (the job goes on)."""


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

_DETAILS = (
    error_details_pb2.ErrorInfo,
    error_details_pb2.BadRequest,
    error_details_pb2.RequestInfo,
)


def _details(err: grpc.RpcError) -> dict[type[Message], Message]:
    """The server's ``google.rpc`` details by type (none when it sent none or the status is malformed)."""
    try:
        rich = rpc_status.from_call(err)
    except ValueError:
        return {}
    found: dict[type[Message], Message] = {}
    for packed in rich.details if rich else ():
        for kind in _DETAILS:
            if kind not in found and packed.Is(kind.DESCRIPTOR):
                found[kind] = kind()
                packed.Unpack(found[kind])
    return found


def from_rpc_error(err: grpc.RpcError, *, target: str = "") -> CantataError:
    """Map a gRPC error and its ``google.rpc`` details to the SDK's error tree; ``target`` ("the server at
    HOST:PORT (profile P)") names where a call went that reached no server."""
    code = err.code()
    details = _details(err)
    info = details.get(error_details_pb2.ErrorInfo, error_details_pb2.ErrorInfo())
    reason = info.reason if info.domain == ERROR_DOMAIN else ""
    request = details.get(error_details_pb2.RequestInfo)
    request_id = request.request_id if request else dict(err.trailing_metadata() or ()).get(REQUEST_ID_KEY, "")
    message = err.details() or code.name
    common = {"request_id": request_id, "code": code}
    if reason == ErrorReason.INVALID_JOB:
        bad = details.get(error_details_pb2.BadRequest, error_details_pb2.BadRequest())
        return InvalidJob(message, field=bad.field_violations[0].field if bad.field_violations else "", **common)
    if reason == ErrorReason.QUOTA_EXCEEDED:
        what, limit, used, retry = (info.metadata.get(key, "") for key in ("what", "limit", "used", "retry_after_s"))
        return QuotaExceeded(
            message,
            what=what,
            limit=int(float(limit or 0)),
            used=int(used or 0),
            retry_after_s=float(retry or 0),
            **common,
        )
    if reason == ErrorReason.ENROLLMENT_LIMITED:
        what, limit, retry = (info.metadata.get(key, "") for key in ("what", "limit", "retry_after_s"))
        return EnrollmentLimited(
            message, what=what, limit=int(float(limit or 0)), retry_after_s=float(retry or 0), **common
        )
    if reason == ErrorReason.INVALID_WEBHOOK:
        return InvalidWebhook(message, **common)
    if reason == ErrorReason.STORE_FULL:
        return StoreFull(message, **common)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # gRPC's own message-size limit: no reason of ours
        return InvalidArgument(f"request too large: {message}", **common)
    kind = _BY_CODE.get(code, CantataError)
    if kind is Unavailable and target and not request_id:  # no server answered (one that did sends its request id)
        message = f"could not reach {target}: {message}. Is the server running, and is that its address?"
    return kind(message, **common)
