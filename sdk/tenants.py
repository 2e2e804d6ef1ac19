"""``client.tenants``: an admin's view of the tenant lifecycle (``client.tenants()`` lists them)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

from cantata.proto.v1 import admin_pb2, common_pb2
from cantata.sdk.resource import Resource


@dataclass(frozen=True)
class KeyRotation:
    version: int
    objects_rewrapped: int
    retired: list[int]


@dataclass(frozen=True)
class Tenant:
    name: str
    status: str
    fingerprint: str
    max_concurrent_jobs: int
    max_workers_per_job: int
    max_total_steps: int
    running_jobs: int
    approved_by: str
    certificate_serial: str
    certificate_expires: str
    retention_days: int = 0
    max_gpus: int = 0

    @classmethod
    def from_proto(cls, t: admin_pb2.TenantInfo) -> Tenant:
        return cls(
            t.name,
            t.status,
            t.csr_fingerprint,
            t.quota.max_concurrent_jobs,
            t.quota.max_workers_per_job,
            t.quota.max_total_steps,
            t.running_jobs,
            t.approved_by,
            t.certificate_serial,
            t.certificate_expires,
            t.retention_days,
            t.quota.max_gpus,
        )


class Tenants(Resource):
    """``client.tenants`` (admins): calling it lists the tenants, of one ``status`` when given."""

    def __call__(self, status: str = "") -> builtins.list[Tenant]:
        return self.list(status)

    def list(self, status: str = "") -> builtins.list[Tenant]:
        reply = self._call(self._client._admin.ListTenants, admin_pb2.ListTenantsRequest(status=status))
        return [Tenant.from_proto(t) for t in reply.tenants]

    def approve(
        self,
        name: str,
        fingerprint: str,
        *,
        max_concurrent_jobs: int = 0,
        max_workers_per_job: int = 0,
        max_total_steps: int = 0,
        max_gpus: int = 0,
    ) -> Tenant:
        quota = common_pb2.Quota(
            max_concurrent_jobs=max_concurrent_jobs,
            max_workers_per_job=max_workers_per_job,
            max_total_steps=max_total_steps,
            max_gpus=max_gpus,
        )
        request = admin_pb2.ApproveTenantRequest(name=name, csr_fingerprint=fingerprint, quota=quota)
        return Tenant.from_proto(self._call(self._client._admin.ApproveTenant, request))

    def set_quota(
        self,
        name: str,
        *,
        max_concurrent_jobs: int = 0,
        max_workers_per_job: int = 0,
        max_total_steps: int = 0,
        max_gpus: int = 0,
    ) -> Tenant:
        """Change a tenant's limits; zero keeps a limit as it is."""
        quota = common_pb2.Quota(
            max_concurrent_jobs=max_concurrent_jobs,
            max_workers_per_job=max_workers_per_job,
            max_total_steps=max_total_steps,
            max_gpus=max_gpus,
        )
        return Tenant.from_proto(
            self._call(self._client._admin.SetQuota, admin_pb2.SetQuotaRequest(name=name, quota=quota))
        )

    def set_retention(self, name: str, days: int) -> Tenant:
        """Keep a tenant's ended jobs ``days`` days; the server then deletes them, audited (0: keep them)."""
        request = admin_pb2.SetRetentionRequest(name=name, retention_days=days)
        return Tenant.from_proto(self._call(self._client._admin.SetRetention, request))

    def rotate_key(self, tenant: str, *, retire_unused: bool = False) -> KeyRotation:
        """New key version for ``tenant``; stored checkpoints are re-wrapped, bodies untouched."""
        reply = self._call(
            self._client._admin.RotateTenantKey,
            admin_pb2.RotateTenantKeyRequest(tenant=tenant, retire_unused=retire_unused),
        )
        return KeyRotation(reply.version, reply.objects_rewrapped, list(reply.retired))

    def _action(self, method, name: str, reason: str) -> Tenant:
        return Tenant.from_proto(self._call(method, admin_pb2.TenantActionRequest(name=name, reason=reason)))

    def reject(self, name: str, reason: str = "") -> Tenant:
        return self._action(self._client._admin.RejectTenant, name, reason)

    def suspend(self, name: str, reason: str = "") -> Tenant:
        return self._action(self._client._admin.SuspendTenant, name, reason)

    def resume(self, name: str, reason: str = "") -> Tenant:
        return self._action(self._client._admin.ResumeTenant, name, reason)
