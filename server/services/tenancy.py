"""Tenancy: enrollment requests and their status, open to callers without a certificate."""

from __future__ import annotations

import datetime as dt
import time

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from cantata.proto.v1 import tenancy_pb2, tenancy_pb2_grpc
from cantata.security.audit import Action
from cantata.security.pki import (
    CertificateAuthority,
    InvalidCSR,
    csr_fingerprint,
    csr_public_key,
    load_csr,
    tenancy_status_message,
    validate_name,
    verify_message,
)
from cantata.server.auth import caller
from cantata.server.errors import AlreadyExists, InvalidRequest
from cantata.server.store import Conflict, NotFound, Store

STATUS_CLOCK_SKEW = 300  # seconds a status proof may be old or early
MAX_CSR_BYTES = 16 * 1024


class TenancyService(tenancy_pb2_grpc.TenancyServicer):
    def __init__(self, store: Store, ca: CertificateAuthority, tenant_cert_days: int, audit):
        self._store = store
        self._ca = ca
        self._ca_pem = ca.cert_pem
        self._cert_lifetime = dt.timedelta(days=tenant_cert_days)
        self._audit = audit

    def RequestTenancy(self, request, context):
        name = validate_name(request.name)
        if len(request.csr_pem) > MAX_CSR_BYTES:
            raise InvalidCSR("CSR too large")
        load_csr(request.csr_pem)
        fingerprint = csr_fingerprint(request.csr_pem)
        with self._store.database.transaction():  # the request exists only once its record is durable
            try:
                tenant = self._store.add_tenancy_request(name, request.csr_pem, fingerprint)
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
        return tenancy_pb2.RequestTenancyReply(name=name, csr_fingerprint=fingerprint, status=tenant.status)

    def GetTenancyStatus(self, request, context):
        not_found = f"no tenancy request for {request.name!r} with this key"
        try:
            tenant = self._store.tenant(request.name)
        except NotFound:
            raise NotFound(not_found) from None
        if abs(time.time() - request.unix_time) > STATUS_CLOCK_SKEW:
            raise InvalidRequest("status proof is stale; check the clock", field="unix_time")
        public_key = csr_public_key(tenant.csr_pem)
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        if not verify_message(public_key, request.signature, tenancy_status_message(tenant.name, request.unix_time)):
            raise NotFound(not_found)  # same answer as a missing name
        reply = tenancy_pb2.GetTenancyStatusReply(name=tenant.name, status=tenant.status, ca_pem=self._ca_pem)
        if tenant.cert_pem and tenant.status == "APPROVED":
            reply.certificate_pem = tenant.cert_pem
        return reply

    def RenewCertificate(self, request, context):
        """A new certificate for a new key, for a tenant in good standing (checked by the gatekeeper)."""
        me = caller(context)
        if len(request.csr_pem) > MAX_CSR_BYTES:
            raise InvalidCSR("CSR too large")
        public_key = csr_public_key(request.csr_pem)
        cert = self._ca.sign(public_key, me, lifetime=self._cert_lifetime)
        pem = cert.public_bytes(Encoding.PEM)
        with self._store.database.transaction():  # issued only once its record is durable
            self._store.record_certificate(cert.serial_number, me.uri, cert.not_valid_after_utc)
            self._store.set_tenant_certificate(me.name, pem)
            self._audit(
                me.uri,
                Action.CERTIFICATE_ISSUED,
                resource=format(cert.serial_number, "x"),
                tenant=me.name,
                details={"renewal": True, "expires": cert.not_valid_after_utc.isoformat()},
                peer=context.peer(),
            )
        return tenancy_pb2.RenewCertificateReply(certificate_pem=pem)
