"""Authentication and authorization for every RPC.

Identity comes only from the TLS-verified peer certificate. ``RULES`` is the
one authorization table: every method of every service names the roles that
may call it; a method without a rule is denied. ``AuthInterceptor`` wraps each
method's handler (an interceptor cannot abort by itself) so that the check
runs inside the call, with a request id attached to every reply; a refusal
is a status built by :func:`cantata.server.errors.status`.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import grpc

from cantata.proto.vocabulary import REQUEST_ID_KEY
from cantata.security.audit import Action, AuditLogUnavailable
from cantata.security.pki import PeerCertificate, Principal, peer_certificate
from cantata.server.errors import status, wrap_handler
from cantata.server.ports import CertificateRegistry, JobDirectory, TenantDirectory

PUBLIC = "public"  # no client certificate required (TLS still authenticates the server)
ADMIN, TENANT, WORKER = "admin", "tenant", "worker"

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
    "/cantata.v1.Jobs/SubmitJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/GetJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/ListJobs": frozenset({TENANT}),
    "/cantata.v1.Jobs/CancelJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/ResumeJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/WatchJob": frozenset({TENANT}),
    "/cantata.v1.Jobs/ReadLogs": frozenset({TENANT}),
    "/cantata.v1.Jobs/DeleteJob": frozenset({TENANT}),
    "/cantata.v1.Checkpoints/ListCheckpoints": frozenset({TENANT}),
    "/cantata.v1.Checkpoints/DownloadCheckpoint": frozenset({TENANT}),
    "/cantata.v1.Worker/Report": frozenset({WORKER}),
    "/cantata.v1.Worker/GetPeers": frozenset({WORKER}),
    "/cantata.v1.Audit/GetReport": frozenset({ADMIN, TENANT}),
    "/cantata.v1.Audit/ListEvents": frozenset({ADMIN, TENANT}),
    "/cantata.v1.DataSources/RegisterDataSource": frozenset({TENANT}),
    "/cantata.v1.DataSources/ListDataSources": frozenset({TENANT}),
    "/cantata.v1.DataSources/DeleteDataSource": frozenset({TENANT}),
    "/grpc.health.v1.Health/Check": frozenset({PUBLIC}),
    "/grpc.health.v1.Health/Watch": frozenset({PUBLIC}),
    "/grpc.health.v1.Health/List": frozenset({PUBLIC}),
}

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def request_id() -> str:
    return _request_id.get()


def caller(context: grpc.ServicerContext) -> Principal:
    """The verified principal of an authenticated call (the interceptor ran first)."""
    peer = peer_certificate(context.auth_context())
    assert peer is not None and peer.principal is not None, "called without authentication"
    return peer.principal


@dataclass(frozen=True)
class Decision:
    allowed: bool
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str = ""
    principal: Principal | None = None


class Gatekeeper:
    """Decides whether a verified peer may call a method, given live platform state."""

    def __init__(self, certificates: CertificateRegistry, tenants: TenantDirectory, jobs: JobDirectory):
        self._is_revoked = certificates.is_revoked
        self._tenant_status = tenants.tenant_status
        self._job_active = jobs.job_active

    def decide(self, method: str, peer: PeerCertificate | None) -> Decision:
        roles = RULES.get(method)
        if roles is None:
            return Decision(False, grpc.StatusCode.PERMISSION_DENIED, f"no rule for {method}")
        if PUBLIC in roles:
            return Decision(True, principal=peer.principal if peer else None)
        if peer is None or peer.principal is None:
            return Decision(False, grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required")
        principal = peer.principal
        if self._is_revoked(peer.serial):
            return Decision(False, grpc.StatusCode.UNAUTHENTICATED, "certificate revoked", principal)
        if principal.role not in roles:
            return Decision(
                False, grpc.StatusCode.PERMISSION_DENIED, f"{principal.role} may not call {method}", principal
            )
        if principal.role == TENANT:
            status = self._tenant_status(principal.name)
            if status != "APPROVED":
                return Decision(
                    False,
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"tenant {principal.name} is {(status or 'unknown').lower()}",
                    principal,
                )
        if principal.role == WORKER and not self._job_active(principal.name):
            return Decision(False, grpc.StatusCode.PERMISSION_DENIED, "the job is not running", principal)
        return Decision(True, principal=principal)


class AuthInterceptor(grpc.ServerInterceptor):
    """Runs the gatekeeper inside every call and records refusals in the audit log."""

    def __init__(self, gatekeeper: Gatekeeper, audit_append: Callable[..., object]):
        self._gatekeeper = gatekeeper
        self._audit = audit_append

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.request_streaming or not (handler.unary_unary or handler.unary_stream):
            raise RuntimeError(f"client-streaming method {method} is not supported by the gatekeeper")
        return wrap_handler(handler, partial(self._guard_unary, method), partial(self._guard_stream, method))

    def _admit(self, method: str, context: grpc.ServicerContext) -> None:
        _request_id.set(uuid.uuid4().hex)
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id()),))
        decision = self._gatekeeper.decide(method, peer_certificate(context.auth_context()))
        if decision.allowed:
            return
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
                peer=context.peer(),
            )
        context.abort_with_status(
            status(decision.code, decision.reason, reason=decision.code.name, request_id=request_id())
        )

    def _guard_unary(self, method: str, behaviour):
        def guarded(request, context):
            self._admit(method, context)
            return behaviour(request, context)

        return guarded

    def _guard_stream(self, method: str, behaviour):
        def guarded(request, context):
            self._admit(method, context)
            yield from behaviour(request, context)

        return guarded
