"""Admin: the tenant lifecycle (list, approve, reject, suspend, resume)."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable

from cryptography.hazmat.primitives.serialization import Encoding

from cantata.proto.faults import InvalidFault, plan_fault
from cantata.proto.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from cantata.proto.vocabulary import DECENTRALIZED
from cantata.security.anomaly.attack_policy import (
    OWN_FRAME_ATTACKS,
    InvalidAttackConfig,
    SpecOrigin,
    parse_attack_config,
)
from cantata.security.audit import Action, AuditEntry
from cantata.security.keys import KeyProvider
from cantata.security.pki import CertificateAuthority, Principal, csr_public_key
from cantata.security.sealed_checkpoint import key_versions_in_use, rewrap_checkpoints
from cantata.server.auth import caller
from cantata.server.datasource_store import DataSourceStore
from cantata.server.errors import InvalidRequest
from cantata.server.jobs.groups import processes
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.network.ports import AuditSink
from cantata.server.store import Conflict, Store, Tenant
from cantata.server.webhooks.store import WebhookStore
from cantata.storage import open_store

# Which AttackConfig field SimulateAttackRequest.strength sets, per attack.
ATTACK_STRENGTH = {
    "scale": "scale",
    "gaussian": "sigma",
    "alie": "alie_z",
    "ipm": "ipm_epsilon",
    "dissensus": "dissensus_epsilon",
}


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        store: Store,
        ca: CertificateAuthority,
        keyring: KeyProvider,
        data_sources: DataSourceStore,
        webhooks: WebhookStore,
        default_quota: dict,
        tenant_cert_days: int,
        audit: AuditSink,
        lifecycle: JobLifecycle,
        *,
        scraper_cert_days: int = 365,
        metrics_listen: str = "",
        sign_out: Callable[[str], object] = lambda tenant: None,
    ):
        self._store = store
        self._sign_out = sign_out  # ends a tenant's dashboard sessions and voids its login links
        self._scraper_lifetime = dt.timedelta(days=scraper_cert_days)
        self._metrics_listen = metrics_listen
        self._ca = ca
        self._keyring = keyring
        self._data_sources = data_sources
        self._webhooks = webhooks
        self._default_quota = default_quota
        self._cert_lifetime = dt.timedelta(days=tenant_cert_days)
        self._audit = audit.append
        self._audit_all = audit.append_all
        self._audit_writable = audit.require_writable
        self._lifecycle = lifecycle

    def _info(self, tenant: Tenant) -> admin_pb2.TenantInfo:
        running = len([j for j in self._store.jobs(tenant=tenant.name) if not j.terminal])
        info = admin_pb2.TenantInfo(
            name=tenant.name,
            status=tenant.status,
            csr_fingerprint=tenant.csr_fingerprint,
            quota=tenant.quota,
            running_jobs=running,
            approved_by=tenant.approved_by,
            requested_at=tenant.requested_at,
            retention_days=tenant.retention_days,
        )
        current = self._store.current_certificate(Principal.tenant(tenant.name).uri)
        if current:
            info.certificate_serial, info.certificate_expires = current
        return info

    def _record(self, context, action: str, name: str, outcome: str = "ok", **details) -> None:
        self._audit(
            caller(context).uri,
            action,
            resource=name,
            tenant=name,
            outcome=outcome,
            details=details,
            peer=context.peer(),
        )

    def ListTenants(self, request, context):
        return admin_pb2.ListTenantsReply(tenants=[self._info(t) for t in self._store.tenants(request.status)])

    def ApproveTenant(self, request, context):
        quota = common_pb2.Quota(**self._default_quota)
        for f in ("max_concurrent_jobs", "max_workers_per_job", "max_total_steps", "max_gpus"):
            value = getattr(request.quota, f)
            if value < 0:
                raise InvalidRequest(f"quota {f} must be >= 0", field=f"quota.{f}")
            if value:
                setattr(quota, f, value)
        with self._store.database.transaction():  # approved only once its records are durable
            try:
                tenant = self._store.tenant(request.name)
                if tenant.status != "PENDING":
                    raise Conflict(f"tenant {request.name!r} is {tenant.status}, not PENDING")
                if tenant.csr_fingerprint != request.csr_fingerprint:
                    raise Conflict(
                        f"fingerprint mismatch for {request.name!r}: the pending request is {tenant.csr_fingerprint}"
                    )
                principal = Principal.tenant(tenant.name)
                cert = self._ca.sign(csr_public_key(tenant.csr_pem), principal, lifetime=self._cert_lifetime)
                tenant = self._store.approve_tenant(
                    request.name, request.csr_fingerprint, cert.public_bytes(Encoding.PEM), quota, caller(context).name
                )
                self._store.record_certificate(cert.serial_number, principal.uri, cert.not_valid_after_utc)
            except Conflict as exc:
                self._record(context, Action.TENANT_APPROVED, request.name, outcome="refused", reason=str(exc))
                raise
            version = self._keyring.ensure_tenant(tenant.name)
            entry = functools.partial(
                AuditEntry, caller(context).uri, resource=tenant.name, tenant=tenant.name, peer=context.peer()
            )
            self._audit_all(  # the three records of one approval: all durable, or none and no approval
                [
                    entry(Action.TENANT_APPROVED, details={"quota": _quota_dict(quota)}),
                    entry(Action.KEY_CREATED, details={"key_version": version}),
                    entry(Action.CERTIFICATE_ISSUED, details={"serial": format(cert.serial_number, "x")}),
                ]
            )
        return self._info(tenant)

    def RejectTenant(self, request, context):
        return self._change(context, request, Action.TENANT_REJECTED, lambda: self._store.reject_tenant(request.name))

    def SuspendTenant(self, request, context):
        return self._change(
            context,
            request,
            Action.TENANT_SUSPENDED,
            lambda: self._store.set_tenant_status(request.name, "SUSPENDED", expect="APPROVED"),
            then=self._suspended,
        )

    def _suspended(self, tenant: str) -> None:
        """A suspension stops the tenant's jobs and signs it out of the dashboard (a resume does not sign it in)."""
        self._lifecycle.tenant_suspended(tenant)
        self._sign_out(tenant)

    def ResumeTenant(self, request, context):
        return self._change(
            context,
            request,
            Action.TENANT_RESUMED,
            lambda: self._store.set_tenant_status(request.name, "APPROVED", expect="SUSPENDED"),
        )

    def SetQuota(self, request, context):
        for f in ("max_concurrent_jobs", "max_workers_per_job", "max_total_steps", "max_gpus"):
            if getattr(request.quota, f) < 0:
                raise InvalidRequest(f"quota {f} must be >= 0", field=f"quota.{f}")
        with self._store.database.transaction():  # changed only once its record is durable
            tenant = self._store.set_quota(request.name, request.quota)
            self._record(context, Action.QUOTA_CHANGED, tenant.name, quota=_quota_dict(tenant.quota))
        return self._info(tenant)

    def SetRetention(self, request, context):
        if request.retention_days < 0:
            raise InvalidRequest("retention_days must be >= 0 (0 keeps ended jobs)", field="retention_days")
        with self._store.database.transaction():  # changed only once its record is durable
            tenant = self._store.set_retention(request.name, request.retention_days)
            self._record(context, Action.RETENTION_CHANGED, tenant.name, retention_days=tenant.retention_days)
        return self._info(tenant)

    def RevokeCertificate(self, request, context):
        with self._store.database.transaction():  # revoked only once its record is durable
            renewals = self._store.renewals_of(request.serial)  # revoked with it
            principal = self._store.revoke_certificate(request.serial)
            tenant = principal.rsplit("/", 1)[-1] if "/tenant/" in principal else ""
            self._audit(
                caller(context).uri,
                Action.CERTIFICATE_REVOKED,
                resource=request.serial,
                tenant=tenant,
                details={"principal": principal, "reason": request.reason, "renewals_revoked": renewals},
                peer=context.peer(),
            )
        return admin_pb2.RevokeCertificateReply(serial=request.serial.lower(), principal=principal)

    def AddScraper(self, request, context):
        """Sign the CSR as scraper ``name``'s: it may read ``/metrics`` and call nothing else; revoked like any."""
        principal = Principal.scraper(request.name)
        cert = self._ca.sign(csr_public_key(request.csr_pem), principal, lifetime=self._scraper_lifetime)
        serial = format(cert.serial_number, "x")
        with self._store.database.transaction():  # issued only once its record is durable
            self._store.record_certificate(cert.serial_number, principal.uri, cert.not_valid_after_utc)
            self._audit(
                caller(context).uri,
                Action.CERTIFICATE_ISSUED,
                resource=principal.uri,
                details={"serial": serial, "purpose": "metrics scraper"},
                peer=context.peer(),
            )
        return admin_pb2.AddScraperReply(
            cert_pem=cert.public_bytes(Encoding.PEM), serial=serial, metrics_address=self._metrics_listen
        )

    def RotateTenantKey(self, request, context):
        """Rotation rewraps objects in stores no transaction covers, so it starts only while the log can record it."""
        self._store.tenant(request.tenant)
        self._audit_writable()
        version = self._keyring.rotate(request.tenant)
        sources_rewrapped = self._data_sources.rewrap(request.tenant)
        webhooks_rewrapped = self._webhooks.rewrap(request.tenant)
        rewrapped = sources_rewrapped + webhooks_rewrapped
        in_use = self._data_sources.key_versions_in_use(request.tenant) | self._webhooks.key_versions_in_use(
            request.tenant
        )
        for job in self._store.jobs(tenant=request.tenant):
            store = open_store(job.spec.checkpoint_store)
            rewrapped += rewrap_checkpoints(
                store, tenant=job.tenant, job_id=job.id, keys=self._keyring.job_keys(job.tenant, job.id)
            )
            in_use |= key_versions_in_use(store, tenant=job.tenant, job_id=job.id)
        retired = self._keyring.retire_unused(request.tenant, in_use | {version}) if request.retire_unused else []
        self._record(
            context,
            Action.KEY_ROTATED,
            request.tenant,
            key_version=version,
            objects_rewrapped=rewrapped,
            data_sources_rewrapped=sources_rewrapped,
            webhooks_rewrapped=webhooks_rewrapped,
            retired_versions=retired,
        )
        return admin_pb2.RotateTenantKeyReply(version=version, objects_rewrapped=rewrapped, retired=retired)

    def ListAnomalies(self, request, context):
        self._store.job(request.job_id)
        reply = admin_pb2.ListAnomaliesReply()
        for a in self._store.anomalies(request.job_id):
            reply.anomalies.add(
                reporter=a.reporter,
                peer=a.peer,
                round=a.round,
                check=a.check,
                verdict=a.verdict,
                score=a.score,
                quarantined=a.quarantined,
                time=a.time,
            )
        return reply

    def SimulateAttack(self, request, context):
        """Evaluation only: plan an attack by some workers of a queued job (admins only)."""
        raw: dict = {"kind": request.attack, "workers": list(request.workers)}
        if request.strength:
            raw[ATTACK_STRENGTH.get(request.attack, "scale")] = request.strength
        job = self._store.job(request.job_id)
        attack = parse_attack_config(raw, SpecOrigin.ADMIN)
        if attack is None or attack.kind not in OWN_FRAME_ATTACKS:
            raise InvalidAttackConfig(
                f"{request.attack} needs every honest vector: run it in benchmarks/bench_anomaly.py, not in a job"
            )
        if any(w >= job.spec.workers for w in request.workers):
            raise InvalidAttackConfig(f"the job has {job.spec.workers} workers")
        with self._store.database.transaction():  # planned only once its record is durable
            self._store.set_attack(job.id, json.dumps(raw))
            self._audit(
                caller(context).uri,
                Action.ATTACK_SIMULATION_PLANNED,
                resource=job.id,
                tenant=job.tenant,
                details={"attack": request.attack, "workers": list(request.workers)},
                peer=context.peer(),
            )
        return admin_pb2.SimulateAttackReply(job_id=job.id)

    def InjectFault(self, request, context):
        """Evaluation only: corrupt the loss of a queued single or allreduce job at a step (admins only)."""
        job = self._store.job(request.job_id)
        if job.spec.algorithm in DECENTRALIZED:
            raise InvalidRequest(f"{job.spec.algorithm} jobs have no recovery policy to exercise", field="job_id")
        try:
            fault = plan_fault(
                request.fault,
                request.step,
                request.scale,
                request.times,
                list(request.workers),
                steps=job.spec.steps,
                processes=processes(job.spec),
            )
        except InvalidFault as exc:
            raise InvalidRequest(str(exc), field="fault") from None
        with self._store.database.transaction():  # planned only once its record is durable
            self._store.set_fault(job.id, json.dumps(fault.to_dict()))
            self._audit(
                caller(context).uri,
                Action.FAULT_INJECTION_PLANNED,
                resource=job.id,
                tenant=job.tenant,
                details=fault.to_dict(),
                peer=context.peer(),
            )
        return admin_pb2.InjectFaultReply(job_id=job.id)

    def _change(self, context, request, action: str, change, then=None):
        """Change a tenant's standing and record it in one transaction; ``then`` acts on the tenant once recorded."""
        with self._store.database.transaction():
            tenant = change()
            self._record(context, action, tenant.name, reason=request.reason)
        if then is not None:
            then(tenant.name)
        if tenant.status == "REJECTED":
            return admin_pb2.TenantInfo(name=tenant.name, status="REJECTED", csr_fingerprint=tenant.csr_fingerprint)
        return self._info(tenant)


def _quota_dict(quota: common_pb2.Quota) -> dict:
    return {
        "max_concurrent_jobs": quota.max_concurrent_jobs,
        "max_workers_per_job": quota.max_workers_per_job,
        "max_total_steps": quota.max_total_steps,
        "max_gpus": quota.max_gpus,
    }
