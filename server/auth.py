"""Authentication and authorization for every RPC.

Identity comes only from the TLS-verified peer certificate. ``RULES`` is the
one authorization table: every method of every service names the roles that
may call it; a method without a rule is denied. ``AuthInterceptor`` wraps each
method's handler (an interceptor cannot abort by itself) so that the check
runs inside the call, with a request id attached to every reply; a refusal
is a status built by :func:`cantata.server.errors.status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import grpc

from cantata.proto.vocabulary import REQUEST_ID_KEY, ErrorReason
from cantata.security.audit import Action, AuditLogUnavailable
from cantata.security.pki import PeerCertificate, Principal, peer_certificate
from cantata.server.errors import WrappedHandlers, abort, abort_async, ended_with, status, wrap_handler
from cantata.server.network.call_log import DeferredCalls, write_line
from cantata.server.network.ports import CertificateRegistry, JobDirectory, TenantDirectory
from cantata.server.network.streams import StreamCounter

PUBLIC = "public"  # no client certificate required (TLS still authenticates the server)
ADMIN, TENANT, WORKER = "admin", "tenant", "worker"
SCRAPER = "scraper"  # reads /metrics (cantata.server.network.metrics_endpoint); no RPC names it, so it may call none

RULES: dict[str, frozenset[str]] = {
    "/cantata.v1.Tenancy/RequestTenancy": frozenset({PUBLIC}),
    "/cantata.v1.Tenancy/GetTenancyStatus": frozenset({PUBLIC}),
    "/cantata.v1.Tenancy/RenewCertificate": frozenset({TENANT}),
    "/cantata.v1.Admin/ListTenants": frozenset({ADMIN}),
    "/cantata.v1.Admin/ApproveTenant": frozenset({ADMIN}),
    "/cantata.v1.Admin/RejectTenant": frozenset({ADMIN}),
    "/cantata.v1.Admin/SuspendTenant": frozenset({ADMIN}),
    "/cantata.v1.Admin/ResumeTenant": frozenset({ADMIN}),
    "/cantata.v1.Admin/SetQuota": frozenset({ADMIN}),
    "/cantata.v1.Admin/SetRetention": frozenset({ADMIN}),
    "/cantata.v1.Admin/RevokeCertificate": frozenset({ADMIN}),
    "/cantata.v1.Admin/RotateTenantKey": frozenset({ADMIN}),
    "/cantata.v1.Admin/ListAnomalies": frozenset({ADMIN}),
    "/cantata.v1.Admin/SimulateAttack": frozenset({ADMIN}),
    "/cantata.v1.Admin/InjectFault": frozenset({ADMIN}),
    "/cantata.v1.Admin/AddScraper": frozenset({ADMIN}),
    "/cantata.v1.Jobs/SubmitJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/GetJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/ListJobs": frozenset({TENANT}),
    "/cantata.v1.Jobs/CancelJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/ResumeJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/WatchJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/ReadLogs": frozenset({TENANT}),
    "/cantata.v1.Jobs/DeleteJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/GetMetrics": frozenset({TENANT}),
    "/cantata.v1.Sweeps/SubmitSweep": frozenset({TENANT}),
    "/cantata.v1.Sweeps/GetSweep": frozenset({TENANT}),
    "/cantata.v1.Sweeps/ListSweeps": frozenset({TENANT}),
    "/cantata.v1.Sweeps/CancelSweep": frozenset({TENANT}),
    "/cantata.v1.Checkpoints/ListCheckpoints": frozenset({TENANT}),
    "/cantata.v1.Checkpoints/DownloadCheckpoint": frozenset({TENANT}),
    "/cantata.v1.Worker/Report": frozenset({WORKER}),
    "/cantata.v1.Worker/GetPeers": frozenset({WORKER}),
    "/cantata.v1.Audit/GetReport": frozenset({ADMIN, TENANT}),
    "/cantata.v1.Audit/ListEvents": frozenset({ADMIN, TENANT}),
    "/cantata.v1.DataSources/RegisterDataSource": frozenset({TENANT}),
    "/cantata.v1.DataSources/ListDataSources": frozenset({TENANT}),
    "/cantata.v1.DataSources/DeleteDataSource": frozenset({TENANT}),
    "/cantata.v1.Webhooks/AddWebhook": frozenset({TENANT}),
    "/cantata.v1.Webhooks/ListWebhooks": frozenset({TENANT}),
    "/cantata.v1.Webhooks/RemoveWebhook": frozenset({TENANT}),
    "/cantata.v1.Webhooks/ListWebhookDeliveries": frozenset({TENANT}),
    "/cantata.v1.Dashboard/CreateDashboardLogin": frozenset({ADMIN, TENANT}),
    "/grpc.health.v1.Health/Check": frozenset({PUBLIC}),
    "/grpc.health.v1.Health/Watch": frozenset({PUBLIC}),
    "/grpc.health.v1.Health/List": frozenset({PUBLIC}),
}

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def request_id() -> str:
    return _request_id.get()


# The call's verified peer, read once per call by the interceptor (the handler's ``caller`` reads it again here).
_peer: contextvars.ContextVar[PeerCertificate | None] = contextvars.ContextVar("peer", default=None)


def caller(context: grpc.ServicerContext) -> Principal:
    """The verified principal of an authenticated call (read once by the interceptor, else from the context)."""
    peer = _peer.get() or peer_certificate(context.auth_context())
    assert peer is not None and peer.principal is not None, "called without authentication"
    return peer.principal


@dataclass(frozen=True)
class Decision:
    allowed: bool
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str = ""
    principal: Principal | None = None
    label: str = ""  # the refusal's kind, for counting: no_rule, no_certificate, revoked, role, tenant, job_ended


class Gatekeeper:
    """Decides whether a verified peer may call a method, given live platform state."""

    def __init__(self, certificates: CertificateRegistry, tenants: TenantDirectory, jobs: JobDirectory):
        self._is_revoked = certificates.is_revoked
        self._tenant_status = tenants.tenant_status
        self._job_active = jobs.job_active

    def decide(self, method: str, peer: PeerCertificate | None) -> Decision:
        roles = RULES.get(method)
        if roles is None:
            return Decision(False, grpc.StatusCode.PERMISSION_DENIED, f"no rule for {method}", label="no_rule")
        if PUBLIC in roles:
            return Decision(True, principal=peer.principal if peer else None)
        if peer is None or peer.principal is None:
            return Decision(
                False, grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required", label="no_certificate"
            )
        principal = peer.principal
        if self._is_revoked(peer.serial):
            return Decision(False, grpc.StatusCode.UNAUTHENTICATED, "certificate revoked", principal, "revoked")
        if principal.role not in roles:
            return Decision(
                False, grpc.StatusCode.PERMISSION_DENIED, f"{principal.role} may not call {method}", principal, "role"
            )
        if principal.role == TENANT:
            status = self._tenant_status(principal.name)
            if status != "APPROVED":
                return Decision(
                    False,
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"tenant {principal.name} is {(status or 'unknown').lower()}",
                    principal,
                    "tenant",
                )
        if principal.role == WORKER and not self._job_active(principal.name):
            return Decision(False, grpc.StatusCode.PERMISSION_DENIED, "the job is not running", principal, "job_ended")
        return Decision(True, principal=principal)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Runs the gatekeeper inside every call, records refusals in the audit log, caps open streams, logs each call.

    Every call gets a request id (a trailer) and one line in the server log: method, principal, status code,
    latency and request id; ``observe(method, code, seconds)`` and ``refused(label)`` count them (Prometheus).
    Streams are counted against ``streams`` per principal (per peer address for an anonymous caller) while
    they are open.
    """

    def __init__(
        self,
        gatekeeper: Gatekeeper,
        audit_append: Callable[..., object],
        streams: StreamCounter,
        *,
        observe: Callable[[str, str, float], None] = lambda method, code, seconds: None,
        refused: Callable[[str], None] = lambda label: None,
    ):
        self._gatekeeper = gatekeeper
        self._audit = audit_append
        self._streams = streams
        self._observe = observe
        self._count_refused = refused
        self._wrapped = WrappedHandlers()
        self._streams_ended = DeferredCalls(observe)

    def close(self) -> None:
        """Log the streams that ended and are not logged yet (once the server stopped)."""
        self._streams_ended.close()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.request_streaming or not (handler.unary_unary or handler.unary_stream):
            raise RuntimeError(f"client-streaming method {method} is not supported by the gatekeeper")
        return self._wrapped.get(
            method,
            handler,
            lambda: wrap_handler(handler, partial(self._guard_unary, method), partial(self._guard_stream, method)),
        )

    def _refusal(
        self, method: str, peer: PeerCertificate | None, address: str
    ) -> tuple[Principal | None, grpc.Status | None]:
        """The caller and, if the gatekeeper refuses it, the status to end the call with (the refusal audited)."""
        decision = self._gatekeeper.decide(method, peer)
        if decision.allowed:
            return decision.principal, None
        return decision.principal, self._refused(method, decision, address)

    def _refused(self, method: str, decision: Decision, address: str) -> grpc.Status:
        """The status that ends a refused call, once the refusal is counted and audited (or the log's failure logged)."""
        self._count_refused(decision.label)
        action = Action.AUTH_FAILED if decision.code == grpc.StatusCode.UNAUTHENTICATED else Action.AUTHZ_DENIED
        principal = decision.principal
        with contextlib.suppress(AuditLogUnavailable):  # refused either way; the log's failure is in the server log
            self._audit(
                principal.uri if principal else "anonymous",
                action,
                resource=method,
                tenant=principal.name if principal and principal.role == TENANT else "",
                outcome="denied",
                details={"reason": decision.reason},
                peer=address,
            )
        return status(decision.code, decision.reason, reason=decision.code.name, request_id=request_id())

    def _begin(self, context) -> PeerCertificate | None:
        rid = uuid.uuid4().hex
        _request_id.set(rid)
        ended_with.set(None)
        context.set_trailing_metadata(((REQUEST_ID_KEY, rid),))
        peer = peer_certificate(context.auth_context())
        _peer.set(peer)
        return peer

    def _guard_unary(self, method: str, behaviour):
        if inspect.iscoroutinefunction(behaviour):
            return self._guard_async_unary(method, behaviour)

        def guarded(request, context):
            started, principal = time.monotonic(), None
            try:
                principal, refusal = self._refusal(method, self._begin(context), context.peer())
                if refusal is not None:
                    abort(context, refusal)
                return behaviour(request, context)
            finally:
                self._observe(method, *_log_call(method, principal, started))

        return guarded

    def _guard_async_unary(self, method: str, behaviour):
        """A unary handler that runs on the event loop: the gatekeeper's answer is read there (from memory, or
        one indexed read); a refusal's audit record is written in a thread."""

        async def guarded(request, context):
            started, principal = time.monotonic(), None
            try:
                peer = self._begin(context)
                decision = self._gatekeeper.decide(method, peer)
                principal = decision.principal
                if not decision.allowed:
                    refusal = await asyncio.to_thread(self._refused, method, decision, context.peer())
                    await abort_async(context, refusal)
                return await behaviour(request, context)
            finally:
                self._observe(method, *_log_call(method, principal, started))

        return guarded

    def _stream_ended(self, method: str, principal: Principal | None, started: float) -> None:
        """A stream ended on the event loop: its line is written, and it is counted, by the access log's thread."""
        who, code, latency_ms = _ended(method, principal, started)
        self._streams_ended.ended(method, who, code, latency_ms, request_id())

    def _guard_stream(self, method: str, behaviour):
        async def guarded(request, context):
            started, principal = time.monotonic(), None
            try:
                peer = self._begin(context)
                principal, refusal = await asyncio.to_thread(self._refusal, method, peer, context.peer())
                if refusal is not None:
                    await abort_async(context, refusal)
                who = principal.uri if principal else "anonymous:" + context.peer().rpartition(":")[0]
                if not self._streams.acquire(who):
                    self._count_refused("stream_cap")
                    cap = str(self._streams.cap)
                    await abort_async(
                        context,
                        status(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"quota exceeded: {who} already holds {cap} open streams, the most one caller may",
                            reason=ErrorReason.QUOTA_EXCEEDED,
                            request_id=request_id(),
                            metadata={"what": "open streams", "limit": cap, "used": cap},
                        ),
                    )
                try:
                    await behaviour(request, context)
                finally:
                    self._streams.release(who)
            finally:
                self._stream_ended(method, principal, started)

        return guarded


def _ended(method: str, principal: Principal | None, started: float) -> tuple[str, str, float]:
    """How the current call ended: (who, status code, latency in ms)."""
    exc = sys.exc_info()[1]
    code = ended_with.get() or (grpc.StatusCode.OK if exc is None else _code_of(exc))
    return principal.uri if principal else "anonymous", code.name, round((time.monotonic() - started) * 1000, 2)


def _log_call(method: str, principal: Principal | None, started: float) -> tuple[str, float]:
    """One line per call: what, who, how it ended, how long it took, and its request id; returns (code, seconds)."""
    who, code, latency_ms = _ended(method, principal, started)
    write_line(method, who, code, latency_ms, request_id())
    return code, latency_ms / 1000


def _code_of(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN
