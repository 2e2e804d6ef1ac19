"""Tenancy: enrollment requests and their status, open to callers without a certificate."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import time

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from cantata.proto.v1 import tenancy_pb2, tenancy_pb2_grpc
from cantata.security.audit import Action, AuditEntry, AuditLogUnavailable, Outcome
from cantata.security.pki import (
    CertificateAuthority,
    InvalidCSR,
    csr_fingerprint,
    csr_public_key,
    load_csr,
    peer_certificate,
    tenancy_status_message,
    validate_name,
    verify_message,
)
from cantata.server.auth import caller
from cantata.server.enrollment import EnrollmentLimited, EnrollmentLimits, RateLimiter, RefusalDigest, source_address
from cantata.server.errors import AlreadyExists, InvalidRequest
from cantata.server.network.ports import AuditSink
from cantata.server.store import Conflict, NotFound, Store, Tenant

STATUS_CLOCK_SKEW = 300  # seconds a status proof may be old or early
MAX_CSR_BYTES = 16 * 1024


# Verifies status proofs for names nobody requested, so that a missing name costs what a present one does.
_DECOY_KEY = ec.generate_private_key(ec.SECP256R1()).public_key()


class TenancyService(tenancy_pb2_grpc.TenancyServicer):
    def __init__(
        self,
        store: Store,
        ca: CertificateAuthority,
        tenant_cert_days: int,
        audit: AuditSink,
        *,
        limits: EnrollmentLimits,
        refusals: RefusalDigest,
    ):
        self._store = store
        self._ca = ca
        self._ca_pem = ca.cert_pem
        self._cert_lifetime = dt.timedelta(days=tenant_cert_days)
        self._audit = audit.append
        self._audit_all = audit.append_all
        self._limits = limits
        self._rate = RateLimiter(limits.rate_per_minute, limits.burst)
        self._refusals = refusals

    def _admit(self, context, method: str) -> None:
        """Spend one of the caller's enrollment calls; a refusal is counted in the audit log."""
        try:
            self._rate.take(source_address(context.peer()))
        except EnrollmentLimited as exc:
            self._refused(context, method, exc)
            raise

    def _refused(self, context, method: str, exc: EnrollmentLimited) -> None:
        with contextlib.suppress(AuditLogUnavailable):  # refused either way
            self._refusals.append(
                "anonymous",
                Action.AUTHZ_DENIED,
                resource=method,
                outcome=Outcome.DENIED,
                details={"reason": f"enrollment limit: {exc.what}"},
                peer=context.peer(),
            )

    def _expire_stale(self) -> None:
        """Delete the requests pending longer than the limits allow, each with its record (the caller holds the transaction)."""
        for tenant in self._store.expire_pending(self._limits.expired_before(dt.datetime.now(dt.UTC))):
            self._audit(
                "server",
                Action.TENANCY_EXPIRED,
                resource=tenant.name,
                tenant=tenant.name,
                details={"csr_fingerprint": tenant.csr_fingerprint, "requested_at": tenant.requested_at},
            )

    def RequestTenancy(self, request, context):
        self._admit(context, "/cantata.v1.Tenancy/RequestTenancy")
        name = validate_name(request.name)
        if len(request.csr_pem) > MAX_CSR_BYTES:
            raise InvalidCSR("CSR too large")
        load_csr(request.csr_pem)
        fingerprint = csr_fingerprint(request.csr_pem)
        with self._store.database.transaction():  # expired only once their records are durable
            self._expire_stale()
        try:
            with self._store.database.transaction():  # the request exists only once its record is durable
                try:
                    tenant = self._store.add_tenancy_request(
                        name,
                        request.csr_pem,
                        fingerprint,
                        source=source_address(context.peer()),
                        admit=self._limits.admit_pending,
                    )
                except Conflict as exc:
                    raise AlreadyExists(str(exc)) from exc
                self._audit(
                    "anonymous",
                    Action.TENANCY_REQUESTED,
                    resource=name,
                    tenant=name,
                    details={"csr_fingerprint": fingerprint},
                    peer=context.peer(),
                )
        except EnrollmentLimited as exc:
            self._refused(context, "/cantata.v1.Tenancy/RequestTenancy", exc)
            raise
        return tenancy_pb2.RequestTenancyReply(name=name, csr_fingerprint=fingerprint, status=tenant.status)

    def GetTenancyStatus(self, request, context):
        """The request is checked in full before any lookup: a missing name and a wrong key answer alike."""
        self._admit(context, "/cantata.v1.Tenancy/GetTenancyStatus")
        name = validate_name(request.name)
        if abs(time.time() - request.unix_time) > STATUS_CLOCK_SKEW:
            raise InvalidRequest("status proof is stale; check the clock", field="unix_time")
        try:
            tenant: Tenant | None = self._store.tenant(name)
        except NotFound:
            tenant = None
        public_key = csr_public_key(tenant.csr_pem) if tenant is not None else _DECOY_KEY
        proven = verify_message(public_key, request.signature, tenancy_status_message(name, request.unix_time))
        if tenant is None or not proven:
            raise NotFound(f"no tenancy request for {name!r} with this key")
        reply = tenancy_pb2.GetTenancyStatusReply(name=tenant.name, status=tenant.status, ca_pem=self._ca_pem)
        if tenant.cert_pem and tenant.status == "APPROVED":
            reply.certificate_pem = tenant.cert_pem
        return reply

    def RenewCertificate(self, request, context):
        """A new certificate for a new key, for a tenant in good standing (checked by the gatekeeper).

        The renewal supersedes the certificate that asked for it (revoked in the same transaction),
        and remembers it: revoking a certificate revokes every certificate renewed from it.
        """
        me = caller(context)
        peer = peer_certificate(context.auth_context())
        assert peer is not None  # the gatekeeper admitted a tenant certificate
        predecessor = format(peer.serial, "x")
        if len(request.csr_pem) > MAX_CSR_BYTES:
            raise InvalidCSR("CSR too large")
        public_key = csr_public_key(request.csr_pem)
        cert = self._ca.sign(public_key, me, lifetime=self._cert_lifetime)
        pem = cert.public_bytes(Encoding.PEM)
        serial = format(cert.serial_number, "x")
        entry = functools.partial(AuditEntry, me.uri, tenant=me.name, peer=context.peer())
        with self._store.database.transaction():  # issued only once its records are durable
            with contextlib.suppress(NotFound):  # a certificate this server never recorded cannot be revoked
                self._store.revoke_certificate(predecessor)  # first: its lineage does not hold the renewal yet
            self._store.record_certificate(
                cert.serial_number, me.uri, cert.not_valid_after_utc, renewed_from=predecessor
            )
            self._store.set_tenant_certificate(me.name, pem)
            expires = cert.not_valid_after_utc.isoformat()
            self._audit_all(  # both records durable, or neither and no renewal
                [
                    entry(
                        Action.CERTIFICATE_ISSUED,
                        resource=serial,
                        details={"renewal": True, "renewed_from": predecessor, "expires": expires},
                    ),
                    entry(
                        Action.CERTIFICATE_REVOKED,
                        resource=predecessor,
                        details={"principal": me.uri, "reason": f"superseded by its renewal {serial}"},
                    ),
                ]
            )
        return tenancy_pb2.RenewCertificateReply(certificate_pem=pem)
