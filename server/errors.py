"""Domain errors as gRPC statuses with ``google.rpc`` details.

Servicers raise domain errors; they never abort a call themselves.
``MAPPING`` gives each domain error class its status code and the
``ErrorInfo`` reason clients read; :class:`ErrorInterceptor` turns a raised
one into a status whose details carry an ``ErrorInfo`` (domain ``cantata``),
a ``BadRequest`` naming an invalid field, a ``QuotaFailure`` for a tenant
limit, and the call's request id as ``RequestInfo``. Anything unmapped is a
bug: it is logged with its traceback and left to gRPC (``UNKNOWN``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cantata.proto.vocabulary import ERROR_DOMAIN, REQUEST_ID_KEY, ErrorReason
from cantata.security.anomaly.attack_policy import InvalidAttackConfig
from cantata.security.audit import AuditLogUnavailable
from cantata.security.keys import UnknownTenantError
from cantata.security.pki import InvalidCSR, InvalidName, Principal, peer_certificate
from cantata.server.dashboard.signin import LoginsLimited
from cantata.server.database import DatabaseUnavailable
from cantata.server.datasource_store import DataSourceExists, DataSourceNotFound, InvalidDataSource
from cantata.server.enrollment import EnrollmentLimited
from cantata.server.jobs.jobspec import InvalidField
from cantata.server.store import Conflict, NotFound, QuotaExceeded, RequestIdReused
from cantata.server.webhooks.targets import InvalidWebhook
from cantata.storage import StoreFull, StoreNotFound, StorePermissionError, StoreUnavailableError

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """A refusal a servicer decides itself, where no lower layer has an error for it."""


class Refused(ServiceError):
    """The caller is authenticated but may not do this (``PERMISSION_DENIED``)."""


class AlreadyExists(ServiceError):
    """The object the request would create exists already (``ALREADY_EXISTS``)."""


class InvalidRequest(ServiceError):
    """A malformed request; ``field``, when given, names the offending field."""

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.field = field


class Unavailable(ServiceError):
    """A backing service (such as a checkpoint store) cannot be reached now."""


class DataLoss(ServiceError):
    """Stored data failed verification; nothing of it was served."""


@dataclass(frozen=True)
class Mapped:
    code: grpc.StatusCode
    reason: ErrorReason


MAPPING: dict[type[Exception], Mapped] = {
    NotFound: Mapped(grpc.StatusCode.NOT_FOUND, ErrorReason.NOT_FOUND),
    UnknownTenantError: Mapped(grpc.StatusCode.NOT_FOUND, ErrorReason.NOT_FOUND),
    DataSourceNotFound: Mapped(grpc.StatusCode.NOT_FOUND, ErrorReason.DATA_SOURCE_NOT_FOUND),
    Conflict: Mapped(grpc.StatusCode.FAILED_PRECONDITION, ErrorReason.CONFLICT),
    RequestIdReused: Mapped(grpc.StatusCode.ALREADY_EXISTS, ErrorReason.REQUEST_ID_REUSED),
    AlreadyExists: Mapped(grpc.StatusCode.ALREADY_EXISTS, ErrorReason.ALREADY_EXISTS),
    DataSourceExists: Mapped(grpc.StatusCode.ALREADY_EXISTS, ErrorReason.DATA_SOURCE_EXISTS),
    QuotaExceeded: Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.QUOTA_EXCEEDED),
    LoginsLimited: Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.QUOTA_EXCEEDED),
    EnrollmentLimited: Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.ENROLLMENT_LIMITED),
    InvalidField: Mapped(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_JOB),
    InvalidRequest: Mapped(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_ARGUMENT),
    InvalidDataSource: Mapped(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_DATA_SOURCE),
    InvalidName: Mapped(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_NAME),
    InvalidWebhook: Mapped(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_WEBHOOK),
    InvalidCSR: Mapped(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_CSR),
    InvalidAttackConfig: Mapped(grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_ATTACK),
    Refused: Mapped(grpc.StatusCode.PERMISSION_DENIED, ErrorReason.PERMISSION_DENIED),
    Unavailable: Mapped(grpc.StatusCode.UNAVAILABLE, ErrorReason.UNAVAILABLE),
    AuditLogUnavailable: Mapped(grpc.StatusCode.UNAVAILABLE, ErrorReason.UNAVAILABLE),
    # A full or failing data disk: the request changed nothing and may be sent again once there is space.
    DatabaseUnavailable: Mapped(grpc.StatusCode.UNAVAILABLE, ErrorReason.UNAVAILABLE),
    DataLoss: Mapped(grpc.StatusCode.DATA_LOSS, ErrorReason.DATA_LOSS),
    # Blob stores: only a transient error is UNAVAILABLE; the others need an operator, so retrying is pointless.
    StoreUnavailableError: Mapped(grpc.StatusCode.UNAVAILABLE, ErrorReason.UNAVAILABLE),
    StoreNotFound: Mapped(grpc.StatusCode.FAILED_PRECONDITION, ErrorReason.STORE_NOT_FOUND),
    StorePermissionError: Mapped(grpc.StatusCode.PERMISSION_DENIED, ErrorReason.STORE_PERMISSION_DENIED),
    StoreFull: Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.STORE_FULL),
}


def mapping_of(exc: BaseException) -> Mapped | None:
    """The mapping of ``exc``'s class or of its nearest mapped base class."""
    return next((MAPPING[cls] for cls in type(exc).__mro__ if cls in MAPPING), None)


@dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def status(
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str,
    request_id: str,
    metadata: dict[str, str] | None = None,
    details: Sequence[Message] = (),
) -> grpc.Status:
    """A non-OK status: ``ErrorInfo``, then ``details``, then the request id, also kept as a trailer."""
    packed = []
    for detail in (
        error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata or {}),
        *details,
        error_details_pb2.RequestInfo(request_id=request_id),
    ):
        any_detail = any_pb2.Any()
        any_detail.Pack(detail)
        packed.append(any_detail)
    rich = status_pb2.Status(code=code.value[0], message=f"{message} (request {request_id})", details=packed)
    base = rpc_status.to_status(rich)
    return _Status(base.code, base.details, (*base.trailing_metadata, (REQUEST_ID_KEY, request_id)))


def status_of(exc: Exception, *, request_id: str, principal: Principal | None = None) -> grpc.Status | None:
    """The status a domain error becomes, or None if it is not one."""
    mapped = mapping_of(exc)
    if mapped is None:
        return None
    metadata: dict[str, str] = {}
    details: list[Message] = []
    field = exc.field if isinstance(exc, InvalidField | InvalidRequest) else ""
    if field:
        metadata["field"] = field
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[error_details_pb2.BadRequest.FieldViolation(field=field, description=str(exc))]
            )
        )
    if isinstance(exc, RequestIdReused):
        metadata.update(request_id=exc.request_id, job_id=exc.job_id)
    if isinstance(exc, EnrollmentLimited):
        metadata.update(what=exc.what, limit=f"{exc.limit:g}", retry_after_s=f"{exc.retry_after_s:.0f}")
    if isinstance(exc, LoginsLimited):
        retry = max(1, round(exc.retry_after_s))
        metadata.update(what=exc.what, limit=f"{exc.limit:g}", used=str(exc.used), retry_after_s=str(retry))
        details.append(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry)))
    if isinstance(exc, QuotaExceeded | LoginsLimited):
        if isinstance(exc, QuotaExceeded):
            metadata.update(what=exc.what, limit=str(exc.limit), used=str(exc.used))
        subject = f"tenant:{principal.name}" if principal else ""
        details.append(
            error_details_pb2.QuotaFailure(
                violations=[error_details_pb2.QuotaFailure.Violation(subject=subject, description=str(exc))]
            )
        )
    return status(
        mapped.code, str(exc), reason=mapped.reason, request_id=request_id, metadata=metadata, details=details
    )


Behaviour = Callable[[Any, Any], Any]

# The status code a call ended with, when the server ended it (set by :func:`abort` and :func:`abort_async`).
ended_with: contextvars.ContextVar[grpc.StatusCode | None] = contextvars.ContextVar("ended_with", default=None)


def abort(context: Any, status: grpc.Status) -> NoReturn:
    """End a call of a plain (thread-pool) handler with ``status``; raises."""
    ended_with.set(status.code)
    context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("context.abort returned")  # grpc raises; never act after a refusal


async def abort_async(context: grpc.aio.ServicerContext, status: grpc.Status) -> NoReturn:
    """End a call of an event-loop handler with ``status``; raises."""
    ended_with.set(status.code)
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("context.abort returned")


def _in_pool(behaviour: Behaviour) -> Behaviour:
    """A plain generator handler as a coroutine that computes each item in a worker thread and writes it.

    So a slow reader holds no thread between items, only the call itself.
    """

    async def stream(request: Any, context: Any) -> None:
        items = await asyncio.to_thread(lambda: iter(behaviour(request, context)))
        while (item := await asyncio.to_thread(next, items, _END)) is not _END:
            await context.write(item)

    return stream


def _written(behaviour: Behaviour) -> Behaviour:
    """An async generator handler as a coroutine that writes each item with ``context.write``."""

    async def stream(request: Any, context: Any) -> None:
        async for item in behaviour(request, context):
            await context.write(item)

    return stream


_END = object()


class WrappedHandlers:
    """Each method's wrapped handler, made on its first call and reused while the method's handler is the same.

    An interceptor is asked for every call; building the wrappers once per method keeps that off each call.
    """

    def __init__(self) -> None:
        self._made: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def get(
        self, method: str, handler: grpc.RpcMethodHandler, wrap: Callable[[], grpc.RpcMethodHandler]
    ) -> grpc.RpcMethodHandler:
        made = self._made.get(method)
        if made is None or made[0] is not handler:
            made = self._made[method] = (handler, wrap())
        return made[1]


def wrap_handler(
    handler: grpc.RpcMethodHandler,
    unary: Callable[[Behaviour], Behaviour],
    stream: Callable[[Behaviour], Behaviour],
    deserializer: Callable[[Any], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """``handler`` with its unary-unary behaviour passed through ``unary``, or its unary-stream one through ``stream``.

    What a server interceptor returns to change how a method runs (an interceptor cannot act on the call itself).
    Unary behaviours are plain functions, run in the server's thread pool, or coroutine functions, run on the
    event loop (for what answers from memory or one indexed read); streaming ones run on the event loop as
    coroutines writing with ``context.write`` (an async or plain generator is made one), so that each wrapper
    is one await per call rather than one more generator that every message passes through. ``deserializer``,
    when given, replaces the handler's request deserializer.
    """
    deserializer = deserializer or handler.request_deserializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            unary(handler.unary_unary),
            request_deserializer=deserializer,
            response_serializer=_passing_bytes(handler.response_serializer),
        )
    behaviour = handler.unary_stream
    if inspect.isasyncgenfunction(behaviour):
        behaviour = _written(behaviour)
    elif not inspect.iscoroutinefunction(behaviour):
        behaviour = _in_pool(behaviour)
    return grpc.unary_stream_rpc_method_handler(
        stream(behaviour),
        request_deserializer=deserializer,
        response_serializer=_passing_bytes(handler.response_serializer),
    )


def _passing_bytes(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """``serialize``, except that a message already serialized (bytes: one broadcast event's, shared by every
    watcher, or a reply kept in memory) is sent as it is."""
    if serialize is None or getattr(serialize, "passes_bytes", False):
        return serialize

    def serialized(message: Any) -> bytes:
        return message if type(message) is bytes else serialize(message)

    serialized.passes_bytes = True  # type: ignore[attr-defined]
    return serialized


@dataclass(frozen=True)
class Undecodable:
    """A request body that does not parse as its method's message: what the handler gets instead of a message."""

    message_type: str
    error: str


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserialize``, except that a body it cannot parse becomes an :class:`Undecodable` (gRPC would end the
    call as ``UNKNOWN``, outside any handler), which the handler's wrapper refuses as ``INVALID_ARGUMENT``."""
    if deserialize is None:
        return None
    message_type = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    name = message_type.full_name if message_type is not None else "request"

    def tolerant(body: bytes) -> Any:
        try:
            return deserialize(body)
        except DecodeError as exc:
            return Undecodable(name, str(exc) or "malformed")

    return tolerant


def _decoded(request: Any) -> Any:
    """``request``, or ``InvalidRequest`` when its body did not parse."""
    if type(request) is Undecodable:
        raise InvalidRequest(f"the request body is not a valid {request.message_type} message ({request.error})")
    return request


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Ends a call whose handler raised a domain error with that error's status; a request body that does not
    parse as its method's message is ``INVALID_ARGUMENT`` (``InvalidRequest``), on every service."""

    def __init__(self, request_id: Callable[[], str]):
        self._request_id = request_id
        self._wrapped = WrappedHandlers()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method
        return self._wrapped.get(
            method,
            handler,
            lambda: wrap_handler(
                handler,
                partial(self._unary, method),
                partial(self._stream, method),
                _tolerant(handler.request_deserializer),
            ),
        )

    def _unary(self, method: str, behaviour: Behaviour):
        if inspect.iscoroutinefunction(behaviour):

            async def translated_async(request: Any, context: Any) -> Any:
                try:
                    return await behaviour(_decoded(request), context)
                except Exception as exc:
                    mapped = self._status(method, context, exc)
                    if mapped is not None:
                        await abort_async(context, mapped)
                    raise

            return translated_async

        def translated(request: Any, context: Any) -> Any:
            try:
                return behaviour(_decoded(request), context)
            except Exception as exc:
                mapped = self._status(method, context, exc)
                if mapped is not None:
                    abort(context, mapped)
                raise

        return translated

    def _stream(self, method: str, behaviour: Behaviour):
        async def translated(request: Any, context: grpc.aio.ServicerContext) -> None:
            try:
                await behaviour(_decoded(request), context)
            except Exception as exc:
                mapped = self._status(method, context, exc)
                if mapped is not None:
                    await abort_async(context, mapped)
                raise

        return translated

    def _status(self, method: str, context: Any, exc: Exception) -> grpc.Status | None:
        """``exc``'s status if it is a domain error; otherwise log it and return None (gRPC says ``UNKNOWN``)."""
        if isinstance(exc, grpc.aio.AbortError):
            return None  # the call was ended already
        peer = peer_certificate(context.auth_context())
        request_id = self._request_id()
        mapped = status_of(exc, request_id=request_id, principal=peer.principal if peer else None)
        if mapped is None:
            log.error("%s failed with an unmapped error (request %s)", method, request_id, exc_info=exc)
        return mapped
