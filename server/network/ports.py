"""The control plane's collaborators, as the parts that use them see them.

Each is a small protocol; :class:`~cantata.server.app.ControlPlane` assembles
the concrete ones (the audit log, the store, the secrets broker, the launcher)
in one place and hands them to the services, the scheduler, the lifecycle and
the gatekeeper through their constructors.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Protocol

from cantata.proto.launch import WorkerSecrets
from cantata.security.audit import AuditEntry
from cantata.server.store import JobRecord


class AuditSink(Protocol):
    """Where security-relevant acts are recorded (:class:`cantata.security.audit.AuditLog`)."""

    def append(
        self,
        actor: str,
        action: str,
        *,
        resource: str = ...,
        tenant: str = ...,
        outcome: str = ...,
        details: dict | None = ...,
        peer: str = ...,
    ) -> object: ...

    def append_all(self, entries: Sequence[AuditEntry]) -> object:
        """Several records of one act: all durable, or none."""
        ...

    def require_writable(self) -> None:
        """Raise ``AuditLogUnavailable`` while the log cannot be written, before an act no transaction can undo."""
        ...


class SecretsBroker(Protocol):
    """What only a job's workers may hold (its keys, its data source's credentials), released for them."""

    def worker_secrets(self, job: JobRecord) -> WorkerSecrets: ...


class CertificateRegistry(Protocol):
    """The certificates the CA minted, and which of them are revoked (the store)."""

    def record_certificate(self, serial: int, principal: str, not_after: dt.datetime) -> None: ...

    def is_revoked(self, serial: int) -> bool: ...


class TenantDirectory(Protocol):
    """Each tenant's standing (the store)."""

    def tenant_status(self, name: str) -> str | None: ...


class JobDirectory(Protocol):
    """Whether a job still runs, so its workers may still call (the store)."""

    def job_active(self, job_id: str) -> bool: ...


class DataSourceDirectory(Protocol):
    """Which data sources a tenant has registered (the data-source store)."""

    def exists(self, tenant: str, name: str) -> bool: ...


class WorkerProcesses(Protocol):
    """A job's worker processes, as the lifecycle acts on them (the launcher)."""

    def relaunch(self, job: JobRecord, worker: int) -> int:
        """Start one exited worker again with the job's secrets as they are now; returns its pid."""
        ...

    def started_at(self, job_id: str, worker: int) -> int:
        """The start time of a running worker's process, which with its pid names it across server restarts."""
        ...

    def alive_workers(self, job_id: str) -> int: ...

    def is_running(self, job_id: str) -> bool: ...

    def terminate(self, job_id: str) -> None:
        """Stop every worker of the job: now, then by force after a grace period."""
        ...

    def scrub(self, job_id: str) -> None:
        """Delete the job's secret-bearing files."""
        ...

    def kill(self, job_id: str, worker: int) -> None:
        """SIGKILL one worker's process group (a hung worker); its exit is reaped as any other."""
        ...

    def log_tail(self, job_id: str, worker: int) -> str: ...
