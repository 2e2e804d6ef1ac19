"""Jobs: submission (idempotent, within quota), their states and progress, resumption, deletion and retention."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import sqlite3
import threading
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import cast

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.proto.vocabulary import TERMINAL_STATES as TERMINAL
from cantata.security.audit import Action, Unsigned
from cantata.server.database import Database
from cantata.server.jobs.groups import processes
from cantata.server.store.anomalies import Anomalies
from cantata.server.store.base import Repository, Signal
from cantata.server.store.errors import Conflict, NotEnded, NotFound, NotResumable, QuotaExceeded, RequestIdReused
from cantata.server.store.events import Events
from cantata.server.store.metrics import MetricsStore
from cantata.server.store.records import RESUMABLE, TRANSITIONS, JobRecord, Tenant, sql_in, utcnow
from cantata.server.store.tenants import Tenants
from cantata.server.store.workers import Workers

# A tenant's unfinished jobs (the concurrent-jobs quota): one row that triggers keep counted (migration 11).
UNFINISHED_OF_TENANT = "SELECT COALESCE((SELECT n FROM unfinished_jobs WHERE tenant=?), 0)"


class Jobs(Repository):
    """The jobs, their tags and per-tenant count of unfinished ones; calling it lists jobs.

    A job's events, workers, anomalies and metrics change through their own repositories, in the same
    transaction as the job.
    """

    tables = frozenset({"jobs", "job_tags", "unfinished_jobs"})
    reads = frozenset({"tenants", "workers"})  # retention's join, the ``with_workers`` filter

    def __init__(
        self,
        database: Database,
        *,
        tenants: Tenants,
        events: Events,
        workers: Workers,
        anomalies: Anomalies,
        metrics: MetricsStore,
        queue_changed: Signal,
    ):
        super().__init__(database)
        self._tenants, self._events, self._workers, self._anomalies = tenants, events, workers, anomalies
        self._metrics = metrics
        self._queue_changed = queue_changed
        self._settling: set[str] = set()  # jobs whose submission is not yet durable and recorded
        self._settling_lock = threading.Lock()

    def submit(
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
                return self.load(db, row["id"]), False
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
            self._events.append_in(
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
        self._queue_changed()

    def settling(self) -> tuple[str, ...]:
        """The jobs whose submission has not settled yet (not acknowledged: not to be placed)."""
        with self._settling_lock:
            return tuple(self._settling)

    def undo_submission(self, job_id: str) -> None:
        """Remove a job whose submission was not recorded (it was never acknowledged; nothing acted on it)."""
        with self._tx() as db:
            db.execute("DELETE FROM job_tags WHERE job_id=?", (job_id,))
            self._events.forget(db, job_id)
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

    def existing(self, job_ids: Collection[str]) -> set[str]:
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
            self._check_quota(db, self._tenants.load(db, tenant), spec)

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
                        f"SELECT spec FROM jobs WHERE tenant=? AND state NOT IN ({sql_in(TERMINAL)})", (tenant.name,)
                    )
                )
            )
            if held + wanted > quota.max_gpus:
                raise QuotaExceeded("GPUs", quota.max_gpus, held + wanted)

    def resume(
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
            job = self.load(db, job_id)
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
            self._events.append_in(
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

    def get(self, job_id: str, tenant: str | None = None) -> JobRecord:
        """The job, scoped to ``tenant`` when given: another tenant's job is NotFound."""
        with self.database.read() as db:
            job = self.load(db, job_id)
            if tenant is not None and job.tenant != tenant:
                raise NotFound(f"job {job_id!r} not found")
            return job

    def active(self, job_id: str) -> bool:
        """True while the job exists and has not reached a terminal state."""
        try:
            return not self.get(job_id).terminal
        except NotFound:
            return False

    def load(self, db: sqlite3.Connection, job_id: str) -> JobRecord:
        """The job, read through ``db`` (the caller's transaction)."""
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

    def __call__(
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
            clauses.append(f"state IN ({sql_in(states)})")
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
            return [self.load(db, i) for i in ids]

    def counts(self) -> dict[int, int]:
        """How many jobs are in each state (states without jobs are absent)."""
        with self.database.read() as db:
            return {int(r[0]): int(r[1]) for r in db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")}

    def delete(self, job_id: str, *, before: Callable[[JobRecord], None]) -> JobRecord:
        """Forget an ended job: its record, events, workers, anomalies, tags and metrics; returns what it was.

        A job that has not ended is a ``Conflict``. ``before(job)`` runs inside
        the transaction once the check passed (the audit record, the removal of
        its checkpoints), so if it raises nothing is deleted.
        """
        with self._tx() as db:
            job = self.load(db, job_id)
            if not job.terminal:
                raise NotEnded(job)
            before(job)
            self._events.forget(db, job_id)
            self._workers.forget(db, job_id)
            self._anomalies.forget(db, job_id)
            db.execute("DELETE FROM job_tags WHERE job_id=?", (job_id,))
            self._metrics.delete(job_id)
            db.execute("DELETE FROM jobs WHERE id=?", (job_id,))
            return job

    def expired(self, now: dt.datetime) -> list[JobRecord]:
        """Ended jobs last changed longer ago than their tenant's retention (tenants without one keep theirs)."""
        with self.database.read() as db:
            rows = db.execute(
                f"SELECT jobs.id, jobs.updated_at, tenants.retention_days FROM jobs JOIN tenants "
                f"ON jobs.tenant = tenants.name WHERE tenants.retention_days > 0 AND jobs.state IN ({sql_in(TERMINAL)}) "
                "ORDER BY jobs.updated_at"
            ).fetchall()
            return [
                self.load(db, r["id"])
                for r in rows
                if dt.datetime.fromisoformat(r["updated_at"]) < now - dt.timedelta(days=r["retention_days"])
            ]

    def transition(self, job_id: str, state: common_pb2.JobState, reason: str = "", *, message: str = "") -> bool:
        """Move a job to ``state`` if allowed from its current state.

        Returns False (and changes nothing) when the job is already terminal or
        the transition is not allowed, so concurrent finishers race safely.
        """
        with self._tx() as db:
            job = self.load(db, job_id)
            if state not in TRANSITIONS.get(job.state, set()):
                return False
            attempts = job.attempts + (1 if state == common_pb2.STARTING else 0)
            db.execute(
                "UPDATE jobs SET state=?, reason=?, attempts=?, updated_at=?, parked=0 WHERE id=?",
                (state, reason or job.reason if state not in TERMINAL else reason, attempts, utcnow(), job_id),
            )
            self._events.append_in(
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

    # ---- attack simulation and fault injection: plans kept with a queued job ----
    def set_attack(self, job_id: str, attack_json: str) -> None:
        with self._tx() as db:
            if self.load(db, job_id).state != common_pb2.QUEUED:
                raise Conflict("attacks can only be planned for a queued job")
            db.execute("UPDATE jobs SET attack=? WHERE id=?", (attack_json, job_id))

    def attack(self, job_id: str) -> str:
        with self.database.read() as db:
            return db.execute("SELECT attack FROM jobs WHERE id=?", (job_id,)).fetchone()[0]

    def set_fault(self, job_id: str, fault_json: str) -> None:
        with self._tx() as db:
            if self.load(db, job_id).state != common_pb2.QUEUED:
                raise Conflict("faults can only be injected into a queued job")
            db.execute("UPDATE jobs SET fault=? WHERE id=?", (fault_json, job_id))

    def fault(self, job_id: str) -> str:
        with self.database.read() as db:
            return db.execute("SELECT fault FROM jobs WHERE id=?", (job_id,)).fetchone()[0]
