"""The control plane's durable state: tenants, certificates, jobs, their events, workers and anomalies.

A ``Store`` works on the server's one :class:`~cantata.server.database.Database`
(its connection, lock and schema). Everything the server knows survives a
crash here. Methods are small transactions; anything that must be atomic
(idempotent submit with quota check, state transitions) is one transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import sqlite3
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.proto.vocabulary import TERMINAL_STATES as TERMINAL
from cantata.security.audit import Action, Unsigned
from cantata.server.broadcast import EventBroadcast
from cantata.server.cache import Cache
from cantata.server.database import Database
from cantata.server.fairness import QueueHead, turn
from cantata.server.groups import processes

ACTIVE = frozenset({common_pb2.STARTING, common_pb2.RUNNING, common_pb2.CANCELLING})
# Ended states a tenant may resume from (``Store.resume_job``): the one way out of a terminal state.
RESUMABLE = frozenset({common_pb2.FAILED, common_pb2.CANCELLED})

# Allowed transitions. RUNNING/STARTING -> QUEUED is a requeue after the server
# itself was stopped or killed: the job resumes from its last checkpoint.
TRANSITIONS = {
    common_pb2.QUEUED: {common_pb2.STARTING, common_pb2.CANCELLED, common_pb2.FAILED},
    common_pb2.STARTING: {
        common_pb2.RUNNING,
        common_pb2.CANCELLING,
        common_pb2.FAILED,
        common_pb2.QUEUED,
        common_pb2.SUCCEEDED,
    },
    common_pb2.RUNNING: {common_pb2.CANCELLING, common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.QUEUED},
    common_pb2.CANCELLING: {common_pb2.CANCELLED, common_pb2.FAILED},
}


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


class StoreError(Exception):
    """Base class of store errors."""


class NotFound(StoreError):
    """No such object for this caller."""


class Conflict(StoreError):
    """The object exists or is in a state that forbids the change."""


class NotResumable(Conflict):
    """Only a FAILED or CANCELLED job can be resumed."""

    def __init__(self, job: JobRecord):
        state = common_pb2.JobState.Name(job.state)
        why = "it finished: there is nothing left to train" if job.state == common_pb2.SUCCEEDED else "it has not ended"
        super().__init__(
            f"job {job.id!r} is {state} and cannot be resumed ({why}); only a FAILED or CANCELLED job can, "
            "or a SUCCEEDED one given more steps"
        )


class NotEnded(Conflict):
    """Only an ended job can be deleted."""

    def __init__(self, job: JobRecord):
        state = common_pb2.JobState.Name(job.state)
        super().__init__(f"job {job.id!r} is {state}: only an ended job can be deleted (cancel it first)")


class RequestIdReused(Conflict):
    """A submit reused a request id of one of the tenant's jobs with a different spec."""

    def __init__(self, request_id: str, job_id: str):
        super().__init__(f"request_id {request_id!r} was already used for {job_id} with a different job spec")
        self.request_id, self.job_id = request_id, job_id


class QuotaExceeded(StoreError):
    def __init__(self, what: str, limit: int, used: int):
        super().__init__(f"quota exceeded: {what} limit {limit}, in use {used}")
        self.what, self.limit, self.used = what, limit, used


@dataclass
class Tenant:
    name: str
    status: str
    csr_pem: bytes
    csr_fingerprint: str
    cert_pem: bytes | None
    quota: common_pb2.Quota
    requested_at: str
    approved_by: str
    retention_days: int = 0  # ended jobs older than this are deleted; 0 keeps them


@dataclass
class JobRecord:
    id: str
    tenant: str
    request_id: str
    spec: common_pb2.JobSpec
    state: common_pb2.JobState
    reason: str
    step: int
    loss: float
    val_loss: float
    attempts: int  # starts, whatever ended the previous one
    created_at: str
    updated_at: str
    failures: int = 0  # worker failures it restarted after (server restarts are none)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass
class WorkerRecord:
    job_id: str
    idx: int
    pid: int
    finished: bool
    failure: str
    restarts: int
    gossip_address: str
    started_at: int = 0  # the process's start time in clock ticks since boot (0: unknown)


@dataclass
class AnomalyRecord:
    job_id: str
    reporter: int
    peer: int
    round: int
    check: str
    verdict: str
    score: float
    quarantined: bool
    time: str


def _in(values: frozenset[int]) -> str:
    return ", ".join(str(int(v)) for v in sorted(values))


# The scheduler's look at the queue: each tenant's oldest queued job that is not parked, with what its turn depends
# on (:mod:`cantata.server.fairness`): its tenant's active jobs and last start; every part of it a seek in an index
# (jobs_queue, jobs_by_state), so it costs the same whatever the queue's length and however many jobs are parked.
# ``skipped`` placeholders name queued jobs to pass over (those about to be parked).
def queue_head_query(skipped: int) -> str:
    return (
        "SELECT head.id, head.tenant, head.last_start, jobs.created_at, jobs.rowid, (SELECT COUNT(*) FROM jobs a "
        f"WHERE a.state IN ({_in(ACTIVE)}) AND a.tenant = head.tenant) AS active "
        "FROM (SELECT t.name AS tenant, t.last_start AS last_start, (SELECT q.id FROM jobs q "
        f"WHERE q.state={int(common_pb2.QUEUED)} AND q.parked=0 AND q.tenant=t.name "
        f"AND q.id NOT IN ({','.join('?' * skipped)}) "
        "ORDER BY q.created_at, q.rowid LIMIT 1) AS id FROM tenants t) AS head JOIN jobs ON jobs.id = head.id"
    )


# A tenant's unfinished jobs (the concurrent-jobs quota): one row that triggers keep counted (migration 11).
UNFINISHED_OF_TENANT = "SELECT COALESCE((SELECT n FROM unfinished_jobs WHERE tenant=?), 0)"


class Store:
    """The platform's state on a database, with change notification for event streams.

    Given a path rather than the server's :class:`Database`, it opens a database of its own.
    """

    def __init__(self, database: Database | Path, broadcast: EventBroadcast | None = None):
        self.database = database if isinstance(database, Database) else Database(database)
        self._broadcast = broadcast
        self.on_queue_change: Callable[[], None] = lambda: None  # a job was queued, or a quota or tenant changed
        # Called with each job event inside the transaction that writes it (the webhooks' outbox).
        self.on_event: Callable[[sqlite3.Connection, str, jobs_pb2.JobEvent], None] = lambda db, job_id, event: None
        # What every call's gatekeeper asks, answered from memory; emptied whenever a commit changed its table,
        # so no writer (of tenants or certificates, in this class or another) can leave a stale answer behind.
        self._tenant_statuses = Cache[str, str | None]()
        self._revoked = Cache[int, bool]()
        self.database.on_commit_changing("tenants", self._tenant_statuses.clear)
        self.database.on_commit_changing("certificates", self._revoked.clear)
        self._settling: set[str] = set()  # jobs whose submission is not yet durable and recorded
        self._settling_lock = threading.Lock()

    def close(self) -> None:
        """Close the database (shared with every other store on it)."""
        self.database.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self.database.transaction() as db:
            yield db

    # ---- tenants -------------------------------------------------------
    def add_tenancy_request(
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
                    return self._tenant(db, name)  # a retried request is idempotent
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
            return self._tenant(db, name)

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
            expired = [self._tenant(db, n) for n in names]
            db.executemany("DELETE FROM tenants WHERE name=? AND status='PENDING'", [(n,) for n in names])
            return expired

    def tenant(self, name: str) -> Tenant:
        with self.database.read() as db:
            return self._tenant(db, name)

    def _tenant(self, db: sqlite3.Connection, name: str) -> Tenant:
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

    def tenant_status(self, name: str) -> str | None:
        """The tenant's status, or None for a name nobody requested (from memory after the first ask)."""
        return self._tenant_statuses.get(name, self._load_tenant_status)

    def _load_tenant_status(self, name: str) -> str | None:
        with self.database.read() as db:
            row = db.execute("SELECT status FROM tenants WHERE name=?", (name,)).fetchone()
        return row["status"] if row else None

    def tenants(self, status: str = "") -> list[Tenant]:
        with self.database.read() as db:
            names = [
                r[0]
                for r in db.execute("SELECT name FROM tenants WHERE (?='' OR status=?) ORDER BY name", (status, status))
            ]
            return [self._tenant(db, n) for n in names]

    def approve_tenant(
        self, name: str, fingerprint: str, cert_pem: bytes, quota: common_pb2.Quota, approved_by: str
    ) -> Tenant:
        with self._tx() as db:
            tenant = self._tenant(db, name)
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
            return self._tenant(db, name)

    def reject_tenant(self, name: str) -> Tenant:
        with self._tx() as db:
            tenant = self._tenant(db, name)
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
            self._tenant(db, name)
            for column in ("max_concurrent_jobs", "max_workers_per_job", "max_total_steps", "max_gpus"):
                value = getattr(quota, column)
                if value:
                    db.execute(f"UPDATE tenants SET {column}=? WHERE name=?", (value, name))
            return self._tenant(db, name)

    def set_retention(self, name: str, days: int) -> Tenant:
        """Keep the tenant's ended jobs ``days`` days (0: for ever)."""
        with self._tx() as db:
            self._tenant(db, name)
            db.execute("UPDATE tenants SET retention_days=? WHERE name=?", (days, name))
            return self._tenant(db, name)

    def set_tenant_certificate(self, name: str, cert_pem: bytes) -> None:
        with self._tx() as db:
            db.execute("UPDATE tenants SET cert_pem=? WHERE name=?", (cert_pem, name))

    def set_tenant_status(self, name: str, status: str, *, expect: str) -> Tenant:
        with self._tx() as db:
            self.database.after_commit(self._queue_changed)
            tenant = self._tenant(db, name)
            if tenant.status != expect:
                raise Conflict(f"tenant {name!r} is {tenant.status}, not {expect}")
            db.execute("UPDATE tenants SET status=? WHERE name=?", (status, name))
            return self._tenant(db, name)

    # ---- certificates --------------------------------------------------
    def record_certificate(
        self, serial: int, principal: str, not_after: dt.datetime, *, renewed_from: str = ""
    ) -> None:
        """Record an issued certificate; ``renewed_from`` is the hex serial of the one whose renewal made it."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO certificates (serial, principal, not_after, renewed_from) VALUES (?,?,?,?)",
                (format(serial, "x"), principal, not_after.isoformat(), renewed_from),
            )

    def revoke_certificate(self, serial: str) -> str:
        """Refuse certificate ``serial`` (hex) and every certificate renewed from it, from now on; returns its principal.

        A renewal is only as trustworthy as the certificate that asked for it: a key stolen and
        renewed before the revocation must not outlive it.
        """
        with self._tx() as db:
            row = db.execute("SELECT principal FROM certificates WHERE serial=?", (serial.lower(),)).fetchone()
            if row is None:
                raise NotFound(f"no certificate with serial {serial}")
            db.executemany(
                "UPDATE certificates SET revoked=1 WHERE serial=?", [(s,) for s in self._lineage(db, serial.lower())]
            )
            return row["principal"]

    def renewals_of(self, serial: str) -> list[str]:
        """The hex serials renewed from ``serial``, directly or through other renewals, oldest first."""
        with self.database.read() as db:
            return self._lineage(db, serial.lower())[1:]

    @staticmethod
    def _lineage(db: sqlite3.Connection, serial: str) -> list[str]:
        """``serial`` and every certificate renewed from it, directly or not."""
        rows = db.execute(
            "WITH RECURSIVE lineage(serial) AS (SELECT ? UNION "
            "SELECT c.serial FROM certificates c JOIN lineage l ON c.renewed_from = l.serial) "
            "SELECT l.serial FROM lineage l LEFT JOIN certificates c ON c.serial = l.serial ORDER BY c.rowid",
            (serial,),
        )
        return [r[0] for r in rows]

    def current_certificate(self, principal: str) -> tuple[str, str] | None:
        """(serial, not_after) of the newest unrevoked certificate issued to ``principal``."""
        with self.database.read() as db:
            row = db.execute(
                "SELECT serial, not_after FROM certificates WHERE principal=? AND revoked=0 "
                "ORDER BY rowid DESC LIMIT 1",
                (principal,),
            ).fetchone()
            return (row["serial"], row["not_after"]) if row else None

    def is_revoked(self, serial: int) -> bool:
        """Whether certificate ``serial`` was revoked (from memory after the first ask)."""
        return self._revoked.get(serial, self._load_revoked)

    def _load_revoked(self, serial: int) -> bool:
        with self.database.read() as db:
            row = db.execute("SELECT revoked FROM certificates WHERE serial=?", (format(serial, "x"),)).fetchone()
        return bool(row and row["revoked"])

    # ---- jobs ----------------------------------------------------------
    def submit_job(
        self,
        tenant: Tenant,
        request_id: str,
        spec: common_pb2.JobSpec,
        submitted_digest: str = "",
        *,
        record: Callable[[str], int] | None = None,
    ) -> tuple[JobRecord, bool]:
        """Create the job, or return the one this request id already made.

        ``submitted_digest`` identifies the spec as the tenant sent it: a
        retry must match it (a job stored without one is compared by its
        stored spec), else ``RequestIdReused``. The quota check and the
        insert are one transaction, so two racing submits cannot both take
        the last free slot. Returns (job, created).

        ``record(job_id)``, last in the transaction, writes the job's audit
        record and returns its seq, kept with the job (:meth:`undo_unrecorded`).
        A job so recorded is *settling* until :meth:`settled`: the scheduler
        passes it over (one writer thread writes submissions, so a retry of its request is answered after it settled).
        """
        with self._tx() as db:
            row = db.execute(
                "SELECT id, spec, spec_digest FROM jobs WHERE tenant=? AND request_id=?", (tenant.name, request_id)
            ).fetchone()
            if row is not None:
                same = (
                    row["spec_digest"] == submitted_digest
                    if row["spec_digest"] and submitted_digest
                    else common_pb2.JobSpec.FromString(row["spec"]) == spec
                )
                if not same:
                    raise RequestIdReused(request_id, row["id"])
                return self._job(db, row["id"]), False
            self._check_quota(db, tenant, spec)
            job_id = "job-" + uuid.uuid4().hex[:16]
            now = utcnow()
            db.execute(
                "INSERT INTO jobs (id, tenant, request_id, spec, spec_digest, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    tenant.name,
                    request_id,
                    spec.SerializeToString(),
                    submitted_digest,
                    common_pb2.QUEUED,
                    now,
                    now,
                ),
            )
            db.executemany("INSERT INTO job_tags (job_id, tag) VALUES (?, ?)", [(job_id, t) for t in spec.tags])
            self._append_event(
                db,
                job_id,
                jobs_pb2.JobEvent(
                    kind=jobs_pb2.STATE, state=common_pb2.QUEUED, total_steps=spec.steps, message="queued"
                ),
            )
            if record is not None:
                with self._settling_lock:
                    self._settling.add(job_id)
                db.execute("UPDATE jobs SET audit_seq=? WHERE id=?", (record(job_id), job_id))
            return JobRecord(
                job_id, tenant.name, request_id, spec, common_pb2.QUEUED, "", 0, 0.0, 0.0, 0, now, now
            ), True

    def settled(self, job_id: str) -> None:
        """The submission of ``job_id`` ended (durable and recorded, or undone): it may be placed, if it exists."""
        with self._settling_lock:
            if job_id not in self._settling:
                return
            self._settling.discard(job_id)
        self.on_queue_change()

    def undo_submission(self, job_id: str) -> None:
        """Remove a job whose submission was not recorded (it was never acknowledged; nothing acted on it)."""
        with self._tx() as db:
            db.execute("DELETE FROM job_tags WHERE job_id=?", (job_id,))
            db.execute("DELETE FROM events WHERE job_id=?", (job_id,))
            db.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    def undo_unrecorded(self, signed: int, recorded: Mapping[int, Unsigned]) -> list[str]:
        """On start: remove the jobs whose ``job_submitted`` record a crash took from the audit log; their ids.

        ``signed`` is the seq the audit log's last checkpoint signed when it was opened and ``recorded`` each
        record after it, by seq. A job whose record's seq is past ``signed`` and not
        so recorded was committed while its record was being synced, and the crash came first: the submission
        was never acknowledged, and nothing acted on the job (it was not placed before it settled).
        """
        with self.database.read() as db:
            rows = db.execute("SELECT id, audit_seq FROM jobs WHERE audit_seq > ?", (signed,)).fetchall()
        undone = [
            r["id"]
            for r in rows
            if (kept := recorded.get(r["audit_seq"])) is None
            or (kept.action, kept.resource) != (Action.JOB_SUBMITTED, r["id"])
        ]
        for job_id in undone:
            self.undo_submission(job_id)
        return undone

    def existing_jobs(self, job_ids: Collection[str]) -> set[str]:
        """Which of ``job_ids`` are jobs (by primary key)."""
        with self.database.read() as db:
            return {
                row[0]
                for row in db.execute(
                    "SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(list(job_ids)),)
                )
            }

    def check_quota(self, tenant: str, spec: common_pb2.JobSpec) -> None:
        """Raise ``QuotaExceeded`` if one more active job with ``spec`` would be over ``tenant``'s limits now."""
        with self.database.read() as db:
            self._check_quota(db, self._tenant(db, tenant), spec)

    def _check_quota(self, db: sqlite3.Connection, tenant: Tenant, spec: common_pb2.JobSpec) -> None:
        """Raise ``QuotaExceeded`` if one more active job with ``spec`` is over the tenant's limits."""
        quota = tenant.quota
        if quota.max_workers_per_job and processes(spec) > quota.max_workers_per_job:
            raise QuotaExceeded("workers per job", quota.max_workers_per_job, processes(spec))
        if quota.max_total_steps and spec.steps > quota.max_total_steps:
            raise QuotaExceeded("steps per job", quota.max_total_steps, spec.steps)
        if quota.max_concurrent_jobs:
            active = db.execute(UNFINISHED_OF_TENANT, (tenant.name,)).fetchone()[0]
            if active >= quota.max_concurrent_jobs:
                raise QuotaExceeded("concurrent jobs", quota.max_concurrent_jobs, active)
        wanted = processes(spec) * spec.gpus_per_worker
        if quota.max_gpus and wanted:
            held = sum(
                processes(s) * s.gpus_per_worker
                for s in (
                    common_pb2.JobSpec.FromString(row[0])
                    for row in db.execute(
                        f"SELECT spec FROM jobs WHERE tenant=? AND state NOT IN ({_in(TERMINAL)})", (tenant.name,)
                    )
                )
            )
            if held + wanted > quota.max_gpus:
                raise QuotaExceeded("GPUs", quota.max_gpus, held + wanted)

    def resume_job(
        self,
        job_id: str,
        tenant: Tenant,
        reason: str,
        *,
        before: Callable[[JobRecord], None],
        spec: Callable[[common_pb2.JobSpec], common_pb2.JobSpec] | None = None,
    ) -> None:
        """Requeue a FAILED or CANCELLED job under its id, with a fresh count of attempts and failures.

        ``spec`` maps the job's spec to the one it resumes with (another mesh, more
        steps; it raises if the change is refused); a SUCCEEDED job resumes only
        when that adds steps. The state check, the quota check (as for a submit)
        and the requeue are one transaction; ``before(job)`` runs inside it once
        the checks passed, so what it records (the audit) precedes the requeue,
        and if it raises nothing changes.
        """
        with self._tx() as db:
            job = self._job(db, job_id)
            resumed = spec(job.spec) if spec is not None else job.spec
            more = resumed.steps > job.spec.steps
            if job.state not in RESUMABLE and not (job.state == common_pb2.SUCCEEDED and more):
                raise NotResumable(job)
            self._check_quota(db, tenant, resumed)
            before(job)
            db.execute(
                "UPDATE jobs SET state=?, reason=?, attempts=0, failures=0, updated_at=?, spec=?, parked=0 WHERE id=?",
                (common_pb2.QUEUED, reason, utcnow(), resumed.SerializeToString(), job_id),
            )
            job = dataclasses.replace(job, spec=resumed)
            self._append_event(
                db,
                job_id,
                jobs_pb2.JobEvent(
                    kind=jobs_pb2.STATE,
                    state=common_pb2.QUEUED,
                    step=job.step,
                    total_steps=job.spec.steps,
                    message=reason,
                    val_loss=job.val_loss,
                ),
            )

    def job(self, job_id: str, tenant: str | None = None) -> JobRecord:
        """The job, scoped to ``tenant`` when given: another tenant's job is NotFound."""
        with self.database.read() as db:
            job = self._job(db, job_id)
            if tenant is not None and job.tenant != tenant:
                raise NotFound(f"job {job_id!r} not found")
            return job

    def job_active(self, job_id: str) -> bool:
        """True while the job exists and has not reached a terminal state."""
        try:
            return not self.job(job_id).terminal
        except NotFound:
            return False

    def _job(self, db: sqlite3.Connection, job_id: str) -> JobRecord:
        row = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"job {job_id!r} not found")
        spec = common_pb2.JobSpec.FromString(row["spec"])
        return JobRecord(
            row["id"],
            row["tenant"],
            row["request_id"],
            spec,
            cast("common_pb2.JobState", row["state"]),
            row["reason"],
            row["step"],
            row["loss"],
            row["val_loss"],
            row["attempts"],
            row["created_at"],
            row["updated_at"],
            row["failures"],
        )

    def jobs(
        self,
        *,
        tenant: str | None = None,
        states: frozenset[int] | None = None,
        tag: str = "",
        since: str = "",
        after: str = "",
        with_workers: bool = False,
        limit: int = 1000,
    ) -> list[JobRecord]:
        """Jobs in creation order, filtered; ``since`` is a :func:`utcnow` time; ``after`` is a page token (the last id
        seen); ``with_workers``: only jobs with workers recorded."""
        clauses, args = [], []
        if with_workers:
            clauses.append("id IN (SELECT job_id FROM workers)")
        if tenant is not None:
            clauses.append("tenant=?")
            args.append(tenant)
        if states is not None:
            clauses.append(f"state IN ({_in(states)})")
        if tag:
            clauses.append("id IN (SELECT job_id FROM job_tags WHERE tag=?)")
            args.append(tag)
        if since:
            clauses.append("created_at >= ?")
            args.append(since)
        if after:
            clauses.append("(created_at, id) > (SELECT created_at, id FROM jobs WHERE id=?)")
            args.append(after)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        with self.database.read() as db:
            ids = [
                r[0] for r in db.execute(f"SELECT id FROM jobs {where} ORDER BY created_at, id LIMIT ?", (*args, limit))
            ]
            return [self._job(db, i) for i in ids]

    def job_counts(self) -> dict[int, int]:
        """How many jobs are in each state (states without jobs are absent)."""
        with self.database.read() as db:
            return {int(r[0]): int(r[1]) for r in db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")}

    def queue_head(self, skip: Collection[str] = ()) -> JobRecord | None:
        """The next job to place: the head of the tenant whose turn it is (:func:`~cantata.server.fairness.turn`).

        Each tenant's head and active jobs are index seeks (``jobs_queue``, ``jobs_by_state``), so the look costs
        the same whatever the queue's length. Parked jobs (:meth:`park`) and those in ``skip`` are passed over.
        """
        with self._settling_lock:
            skip = (*skip, *self._settling)  # not acknowledged yet: placed once settled
        with self.database.read() as db:
            heads = [
                QueueHead(r[0], r[1], r[5], r[2], r[3], r[4])
                for r in db.execute(queue_head_query(len(skip)), tuple(skip))
            ]
            return self._job(db, min(heads, key=turn).job_id) if heads else None

    def delete_job(self, job_id: str, *, before: Callable[[JobRecord], None]) -> JobRecord:
        """Forget an ended job: its record, events, workers, anomalies, tags and metrics; returns what it was.

        A job that has not ended is a ``Conflict``. ``before(job)`` runs inside
        the transaction once the check passed (the audit record, the removal of
        its checkpoints), so if it raises nothing is deleted.
        """
        with self._tx() as db:
            job = self._job(db, job_id)
            if not job.terminal:
                raise NotEnded(job)
            before(job)
            for table in ("events", "workers", "anomalies", "job_tags", "metrics"):
                db.execute(f"DELETE FROM {table} WHERE job_id=?", (job_id,))
            db.execute("DELETE FROM jobs WHERE id=?", (job_id,))
            return job

    def expired_jobs(self, now: dt.datetime) -> list[JobRecord]:
        """Ended jobs last changed longer ago than their tenant's retention (tenants without one keep theirs)."""
        with self.database.read() as db:
            rows = db.execute(
                f"SELECT jobs.id, jobs.updated_at, tenants.retention_days FROM jobs JOIN tenants "
                f"ON jobs.tenant = tenants.name WHERE tenants.retention_days > 0 AND jobs.state IN ({_in(TERMINAL)}) "
                "ORDER BY jobs.updated_at"
            ).fetchall()
            return [
                self._job(db, r["id"])
                for r in rows
                if dt.datetime.fromisoformat(r["updated_at"]) < now - dt.timedelta(days=r["retention_days"])
            ]

    def park(self, verdicts: Sequence[tuple[JobRecord, str]]) -> None:
        """Park queued jobs the executor can never run as it is (each with why): the look at the queue's heads
        passes them until :meth:`unpark`; each says why it waits, as :meth:`set_waiting` does. One transaction;
        a job no longer queued is left as it is."""
        with self._tx() as db:
            for job, reason in verdicts:
                row = db.execute(
                    f"UPDATE jobs SET parked=1 WHERE id=? AND state={int(common_pb2.QUEUED)} RETURNING reason",
                    (job.id,),
                ).fetchone()
                if row is not None and row[0] != reason:
                    self._waiting(db, job, reason)

    def queued_after(self, job: JobRecord, limit: int) -> list[JobRecord]:
        """Up to ``limit`` unparked queued jobs of ``job``'s tenant queued after it, in queue order (an index range)."""
        with self.database.read() as db:
            ids = [
                r[0]
                for r in db.execute(
                    f"SELECT id FROM jobs WHERE state={int(common_pb2.QUEUED)} AND parked=0 AND tenant=? "
                    "AND (created_at, rowid) > (SELECT created_at, rowid FROM jobs WHERE id=?) "
                    "ORDER BY created_at, rowid LIMIT ?",
                    (job.tenant, job.id, limit),
                )
            ]
            return [self._job(db, i) for i in ids]

    def parked_verdicts(self) -> list[tuple[JobRecord, str]]:
        """One parked job of each distinct reason it was parked for, with that reason (one pass over jobs_parked)."""
        with self.database.read() as db:
            rows = db.execute(
                f"SELECT reason, MIN(rowid) AS first FROM jobs WHERE state={int(common_pb2.QUEUED)} AND parked=1 "
                "GROUP BY reason"
            ).fetchall()
            ids = [db.execute("SELECT id FROM jobs WHERE rowid=?", (r["first"],)).fetchone()[0] for r in rows]
            return [(self._job(db, job_id), r["reason"]) for job_id, r in zip(ids, rows, strict=True)]

    def unpark(self, reason: str) -> int:
        """Offer again the queued jobs parked for ``reason`` (the executor's verdict on them may have changed)."""
        with self._tx() as db:
            self.database.after_commit(self._queue_changed)
            return db.execute(
                f"UPDATE jobs SET parked=0 WHERE state={int(common_pb2.QUEUED)} AND parked=1 AND reason=?", (reason,)
            ).rowcount

    def set_waiting(self, job_id: str, reason: str) -> None:
        """Say why a queued job is not placed yet (an event, once per new reason)."""
        with self.database.read() as db:  # the same reason again writes nothing, and syncs nothing
            row = db.execute("SELECT state, reason FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None or row["state"] != common_pb2.QUEUED or row["reason"] == reason:
            return
        with self._tx() as db:
            job = self._job(db, job_id)
            if job.state != common_pb2.QUEUED or job.reason == reason:
                return
            self._waiting(db, job, reason)

    def _waiting(self, db: sqlite3.Connection, job: JobRecord, reason: str) -> None:
        db.execute("UPDATE jobs SET reason=?, updated_at=? WHERE id=?", (reason, utcnow(), job.id))
        self._append_event(
            db,
            job.id,
            jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, total_steps=job.spec.steps, message=f"waiting: {reason}"),
        )

    def transition(self, job_id: str, state: common_pb2.JobState, reason: str = "", *, message: str = "") -> bool:
        """Move a job to ``state`` if allowed from its current state.

        Returns False (and changes nothing) when the job is already terminal or
        the transition is not allowed, so concurrent finishers race safely.
        """
        with self._tx() as db:
            job = self._job(db, job_id)
            if state not in TRANSITIONS.get(job.state, set()):
                return False
            attempts = job.attempts + (1 if state == common_pb2.STARTING else 0)
            db.execute(
                "UPDATE jobs SET state=?, reason=?, attempts=?, updated_at=?, parked=0 WHERE id=?",
                (state, reason or job.reason if state not in TERMINAL else reason, attempts, utcnow(), job_id),
            )
            self._append_event(
                db,
                job_id,
                jobs_pb2.JobEvent(
                    kind=jobs_pb2.STATE,
                    state=state,
                    terminal=state in TERMINAL,
                    step=job.step,
                    total_steps=job.spec.steps,
                    message=message or reason or common_pb2.JobState.Name(state).lower(),
                    val_loss=job.val_loss,
                ),
            )
            return True

    def record_progress(
        self, job_id: str, *, step: int, loss: float | None = None, val_loss: float | None = None
    ) -> None:
        # SQLite stores NaN as NULL: a non-finite loss is reported in events, not kept here
        loss = loss if loss is not None and math.isfinite(loss) else None
        val_loss = val_loss if val_loss is not None and math.isfinite(val_loss) else None
        with self._tx() as db:
            sets, args = ["step=MAX(step, ?)", "updated_at=?"], [step, utcnow()]
            if loss is not None:
                sets.append("loss=?")
                args.append(loss)
            if val_loss is not None:
                sets.append("val_loss=?")
                args.append(val_loss)
            db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id=?", (*args, job_id))

    def count_failure(self, job_id: str) -> int:
        """One more worker failure of the job; returns how many it has had."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET failures=failures+1 WHERE id=?", (job_id,))
            return int(db.execute("SELECT failures FROM jobs WHERE id=?", (job_id,)).fetchone()[0])

    # ---- events --------------------------------------------------------
    def append_event(self, job_id: str, event: jobs_pb2.JobEvent) -> int:
        with self._tx() as db:
            return self._append_event(db, job_id, event)

    def _append_event(self, db: sqlite3.Connection, job_id: str, event: jobs_pb2.JobEvent) -> int:
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id=?", (job_id,)).fetchone()[0]
        event.seq = seq
        event.time.GetCurrentTime()
        db.execute("INSERT INTO events (job_id, seq, body) VALUES (?, ?, ?)", (job_id, seq, event.SerializeToString()))
        self.on_event(db, job_id, event)
        if self._broadcast is not None:
            self.database.after_commit(partial(self._broadcast.publish, job_id, (event,)))
        if event.kind == jobs_pb2.STATE and event.state == common_pb2.QUEUED:
            self.database.after_commit(self._queue_changed)
        return seq

    def _queue_changed(self) -> None:
        self.on_queue_change()

    def events_after(self, job_id: str, cursor: int) -> list[jobs_pb2.JobEvent]:
        """Events with seq > cursor (at most 500: ask again from the last one for more)."""
        with self.database.read() as db:
            rows = db.execute(
                "SELECT body FROM events WHERE job_id=? AND seq>? ORDER BY seq LIMIT 500", (job_id, cursor)
            ).fetchall()
        return [jobs_pb2.JobEvent.FromString(r[0]) for r in rows]

    def resumed_after(self, job_id: str, seq: int) -> bool:
        """Whether the job's state changed after event ``seq``: after a terminal event, only a resume does that."""
        with self.database.read() as db:
            rows = db.execute("SELECT body FROM events WHERE job_id=? AND seq>? ORDER BY seq", (job_id, seq))
            return any(jobs_pb2.JobEvent.FromString(r[0]).kind == jobs_pb2.STATE for r in rows)

    def latest_checkpoint_step(self, job_id: str) -> int:
        """The step of the job's last checkpoint its workers reported committed; 0 if none."""
        with self.database.read() as db:
            for (body,) in db.execute("SELECT body FROM events WHERE job_id=? ORDER BY seq DESC", (job_id,)):
                event = jobs_pb2.JobEvent.FromString(body)
                if event.kind == jobs_pb2.CHECKPOINT:
                    return event.step
        return 0

    # ---- workers -------------------------------------------------------
    def set_workers(self, job_id: str, pids: dict[int, int], started: dict[int, int] | None = None) -> None:
        """A new attempt's workers: process index -> pid, and each one's start time (clock ticks since boot)."""
        started = started or {}
        with self._tx() as db:
            db.execute("DELETE FROM workers WHERE job_id=?", (job_id,))
            db.executemany(
                "INSERT INTO workers (job_id, idx, pid, started_at) VALUES (?, ?, ?, ?)",
                [(job_id, i, pid, started.get(i, 0)) for i, pid in pids.items()],
            )

    def workers(self, job_id: str) -> list[WorkerRecord]:
        with self.database.read() as db:
            return [
                WorkerRecord(
                    r["job_id"],
                    r["idx"],
                    r["pid"],
                    bool(r["finished"]),
                    r["failure"],
                    r["restarts"],
                    r["gossip_address"],
                    r["started_at"],
                )
                for r in db.execute("SELECT * FROM workers WHERE job_id=? ORDER BY idx", (job_id,))
            ]

    def restart_worker(self, job_id: str, idx: int) -> None:
        """A worker about to be relaunched: one restart more, no process yet (pid 0), no gossip endpoint until it
        registers again, its reports numbered anew. Recorded before the relaunch, so that an exit handled again
        (this write failed) relaunches nothing twice."""
        with self._tx() as db:
            db.execute(
                "UPDATE workers SET pid=0, started_at=0, restarts=restarts+1, failure='', gossip_address='', "
                "last_seq=0 WHERE job_id=? AND idx=?",
                (job_id, idx),
            )

    def worker_relaunched(self, job_id: str, idx: int, pid: int, started_at: int = 0) -> None:
        """The relaunched worker's process: its pid and start time (clock ticks since boot)."""
        with self._tx() as db:
            db.execute(
                "UPDATE workers SET pid=?, started_at=? WHERE job_id=? AND idx=?", (pid, started_at, job_id, idx)
            )

    def claim_report(self, job_id: str, idx: int, seq: int) -> bool | None:
        """Whether report ``seq`` of the worker is new (then it is recorded as applied): False for one seen
        before, None while the worker is not recorded yet (its start is being recorded).

        Call it in the transaction that applies the report, so that it is applied exactly once.
        """
        with self._tx() as db:
            row = db.execute("SELECT last_seq FROM workers WHERE job_id=? AND idx=?", (job_id, idx)).fetchone()
            if row is None:
                return None
            if row[0] >= seq:
                return False
            db.execute("UPDATE workers SET last_seq=? WHERE job_id=? AND idx=?", (seq, job_id, idx))
            return True

    def set_round(self, job_id: str, idx: int, round_: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE workers SET round=MAX(round, ?) WHERE job_id=? AND idx=?", (round_, job_id, idx))

    def rounds(self, job_id: str) -> dict[int, int]:
        with self.database.read() as db:
            return dict(db.execute("SELECT idx, round FROM workers WHERE job_id=?", (job_id,)).fetchall())

    def latest_round(self, job_id: str) -> int:
        with self.database.read() as db:
            return db.execute("SELECT COALESCE(MAX(round), 0) FROM workers WHERE job_id=?", (job_id,)).fetchone()[0]

    def set_gossip_address(self, job_id: str, idx: int, address: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE workers SET gossip_address=? WHERE job_id=? AND idx=?", (address, job_id, idx))

    # ---- attack simulation and anomalies ---------------------------------
    def set_attack(self, job_id: str, attack_json: str) -> None:
        with self._tx() as db:
            if self._job(db, job_id).state != common_pb2.QUEUED:
                raise Conflict("attacks can only be planned for a queued job")
            db.execute("UPDATE jobs SET attack=? WHERE id=?", (attack_json, job_id))

    def attack(self, job_id: str) -> str:
        with self.database.read() as db:
            return db.execute("SELECT attack FROM jobs WHERE id=?", (job_id,)).fetchone()[0]

    def set_fault(self, job_id: str, fault_json: str) -> None:
        with self._tx() as db:
            if self._job(db, job_id).state != common_pb2.QUEUED:
                raise Conflict("faults can only be injected into a queued job")
            db.execute("UPDATE jobs SET fault=? WHERE id=?", (fault_json, job_id))

    def fault(self, job_id: str) -> str:
        with self.database.read() as db:
            return db.execute("SELECT fault FROM jobs WHERE id=?", (job_id,)).fetchone()[0]

    def add_anomaly(self, a: AnomalyRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO anomalies VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (a.job_id, a.reporter, a.peer, a.round, a.check, a.verdict, a.score, int(a.quarantined), a.time),
            )

    def anomalies(self, job_id: str) -> list[AnomalyRecord]:
        with self.database.read() as db:
            return [
                AnomalyRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8])
                for r in db.execute("SELECT * FROM anomalies WHERE job_id=? ORDER BY rowid", (job_id,))
            ]

    def mark_worker(self, job_id: str, idx: int, *, finished: bool = False, failure: str = "") -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE workers SET finished=MAX(finished, ?), failure=CASE WHEN ?='' THEN failure "
                "ELSE ? END WHERE job_id=? AND idx=?",
                (int(finished), failure, failure, job_id, idx),
            )
