"""Tenants: their requests for tenancy, approval or rejection, quotas, retention and status."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable

from cantata.proto.v1 import common_pb2
from cantata.server.cache import Cache
from cantata.server.database import Database
from cantata.server.store.base import Repository, Signal
from cantata.server.store.errors import Conflict, NotFound
from cantata.server.store.records import Tenant, utcnow


class Tenants(Repository):
    """The tenants and the fingerprints of rejected requests; calling it lists the tenants."""

    tables = frozenset({"tenants", "rejected_fingerprints"})

    def __init__(self, database: Database, queue_changed: Signal):
        super().__init__(database)
        self._queue_changed = queue_changed
        # What every call's gatekeeper asks, answered from memory; emptied whenever a commit changed the table,
        # so no writer (in this class or another) can leave a stale answer behind.
        self._statuses = Cache[str, str | None]()
        database.on_commit_changing("tenants", self._statuses.clear)

    def request(
        self,
        name: str,
        csr_pem: bytes,
        fingerprint: str,
        *,
        source: str = "",
        admit: Callable[[int, int], None] = lambda pending, from_source: None,
    ) -> Tenant:
        """A new PENDING request from address ``source`` (a retry of the same one is idempotent).

        ``admit(pending, from_source)`` sees how many requests are pending, in all and from
        ``source``, just before a new one is stored, in the same transaction, and raises to refuse it.
        """
        with self._tx() as db:
            if db.execute("SELECT 1 FROM rejected_fingerprints WHERE fingerprint=?", (fingerprint,)).fetchone():
                raise Conflict("this CSR was rejected and cannot be requested again")
            row = db.execute("SELECT status, csr_fingerprint FROM tenants WHERE name=?", (name,)).fetchone()
            if row is not None:
                if row["status"] == "PENDING" and row["csr_fingerprint"] == fingerprint:
                    return self.load(db, name)  # a retried request is idempotent
                raise Conflict(f"tenant {name!r} already exists")
            admit(
                db.execute("SELECT COUNT(*) FROM tenants WHERE status='PENDING'").fetchone()[0],
                db.execute(
                    "SELECT COUNT(*) FROM tenants WHERE status='PENDING' AND requested_from=?", (source,)
                ).fetchone()[0],
            )
            db.execute(
                "INSERT INTO tenants (name, status, csr_pem, csr_fingerprint, requested_at, requested_from) "
                "VALUES (?, 'PENDING', ?, ?, ?, ?)",
                (name, csr_pem, fingerprint, utcnow(), source),
            )
            return self.load(db, name)

    def expire_pending(self, requested_before: dt.datetime) -> list[Tenant]:
        """Delete the requests still PENDING that were made before ``requested_before``; return them."""
        with self._tx() as db:
            names = [
                r[0]
                for r in db.execute(
                    "SELECT name FROM tenants WHERE status='PENDING' AND requested_at < ? ORDER BY name",
                    (requested_before.isoformat(timespec="milliseconds"),),
                )
            ]
            expired = [self.load(db, n) for n in names]
            db.executemany("DELETE FROM tenants WHERE name=? AND status='PENDING'", [(n,) for n in names])
            return expired

    def get(self, name: str) -> Tenant:
        with self.database.read() as db:
            return self.load(db, name)

    def load(self, db: sqlite3.Connection, name: str) -> Tenant:
        """The tenant, read through ``db`` (the caller's transaction)."""
        row = db.execute("SELECT * FROM tenants WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"tenant {name!r} not found")
        quota = common_pb2.Quota(
            max_concurrent_jobs=row["max_concurrent_jobs"],
            max_workers_per_job=row["max_workers_per_job"],
            max_total_steps=row["max_total_steps"],
            max_gpus=row["max_gpus"],
        )
        return Tenant(
            row["name"],
            row["status"],
            row["csr_pem"],
            row["csr_fingerprint"],
            row["cert_pem"],
            quota,
            row["requested_at"],
            row["approved_by"],
            row["retention_days"],
        )

    def status(self, name: str) -> str | None:
        """The tenant's status, or None for a name nobody requested (from memory after the first ask)."""
        return self._statuses.get(name, self._load_status)

    def _load_status(self, name: str) -> str | None:
        with self.database.read() as db:
            row = db.execute("SELECT status FROM tenants WHERE name=?", (name,)).fetchone()
        return row["status"] if row else None

    def __call__(self, status: str = "") -> list[Tenant]:
        """The tenants (those with ``status`` when given), by name."""
        with self.database.read() as db:
            names = [
                r[0]
                for r in db.execute("SELECT name FROM tenants WHERE (?='' OR status=?) ORDER BY name", (status, status))
            ]
            return [self.load(db, n) for n in names]

    def approve(
        self, name: str, fingerprint: str, cert_pem: bytes, quota: common_pb2.Quota, approved_by: str
    ) -> Tenant:
        with self._tx() as db:
            tenant = self.load(db, name)
            if tenant.status != "PENDING":
                raise Conflict(f"tenant {name!r} is {tenant.status}, not PENDING")
            if tenant.csr_fingerprint != fingerprint:
                raise Conflict(f"fingerprint mismatch for {name!r}: the pending request is {tenant.csr_fingerprint}")
            db.execute(
                "UPDATE tenants SET status='APPROVED', cert_pem=?, max_concurrent_jobs=?, "
                "max_workers_per_job=?, max_total_steps=?, max_gpus=?, approved_by=? WHERE name=?",
                (
                    cert_pem,
                    quota.max_concurrent_jobs,
                    quota.max_workers_per_job,
                    quota.max_total_steps,
                    quota.max_gpus,
                    approved_by,
                    name,
                ),
            )
            return self.load(db, name)

    def reject(self, name: str) -> Tenant:
        with self._tx() as db:
            tenant = self.load(db, name)
            if tenant.status != "PENDING":
                raise Conflict(f"tenant {name!r} is {tenant.status}, not PENDING")
            db.execute(
                "INSERT OR IGNORE INTO rejected_fingerprints VALUES (?, ?, ?)", (tenant.csr_fingerprint, name, utcnow())
            )
            db.execute("DELETE FROM tenants WHERE name=?", (name,))
            tenant.status = "REJECTED"
            return tenant

    def set_quota(self, name: str, quota: common_pb2.Quota) -> Tenant:
        """Change the non-zero fields of a tenant's quota."""
        with self._tx() as db:
            self.database.after_commit(self._queue_changed)
            self.load(db, name)
            for column in ("max_concurrent_jobs", "max_workers_per_job", "max_total_steps", "max_gpus"):
                value = getattr(quota, column)
                if value:
                    db.execute(f"UPDATE tenants SET {column}=? WHERE name=?", (value, name))
            return self.load(db, name)

    def set_retention(self, name: str, days: int) -> Tenant:
        """Keep the tenant's ended jobs ``days`` days (0: for ever)."""
        with self._tx() as db:
            self.load(db, name)
            db.execute("UPDATE tenants SET retention_days=? WHERE name=?", (days, name))
            return self.load(db, name)

    def set_certificate(self, name: str, cert_pem: bytes) -> None:
        with self._tx() as db:
            db.execute("UPDATE tenants SET cert_pem=? WHERE name=?", (cert_pem, name))

    def set_status(self, name: str, status: str, *, expect: str) -> Tenant:
        with self._tx() as db:
            self.database.after_commit(self._queue_changed)
            tenant = self.load(db, name)
            if tenant.status != expect:
                raise Conflict(f"tenant {name!r} is {tenant.status}, not {expect}")
            db.execute("UPDATE tenants SET status=? WHERE name=?", (status, name))
            return self.load(db, name)
