"""The queue: which queued job to place next (fair between tenants), and the jobs parked until the executor changes.

It is a view of the jobs table: the queued rows, their ``parked`` flag and why each waits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.server.database import Database
from cantata.server.jobs.fairness import QueueHead, turn
from cantata.server.store.base import Repository, Signal
from cantata.server.store.events import Events
from cantata.server.store.jobs import Jobs
from cantata.server.store.records import ACTIVE, JobRecord, sql_in, utcnow


# The scheduler's look at the queue: each tenant's oldest queued job that is not parked, with what its turn depends
# on (:mod:`cantata.server.jobs.fairness`): its tenant's active jobs and last start; every part of it a seek in an index
# (jobs_queue, jobs_by_state), so it costs the same whatever the queue's length and however many jobs are parked.
# ``skipped`` placeholders name queued jobs to pass over (those about to be parked).
def queue_head_query(skipped: int) -> str:
    return (
        "SELECT head.id, head.tenant, head.last_start, jobs.created_at, jobs.rowid, (SELECT COUNT(*) FROM jobs a "
        f"WHERE a.state IN ({sql_in(ACTIVE)}) AND a.tenant = head.tenant) AS active "
        "FROM (SELECT t.name AS tenant, t.last_start AS last_start, (SELECT q.id FROM jobs q "
        f"WHERE q.state={int(common_pb2.QUEUED)} AND q.parked=0 AND q.tenant=t.name "
        f"AND q.id NOT IN ({','.join('?' * skipped)}) "
        "ORDER BY q.created_at, q.rowid LIMIT 1) AS id FROM tenants t) AS head JOIN jobs ON jobs.id = head.id"
    )


class Queue(Repository):
    """The queued jobs in placement order; it writes only their ``parked`` flag and waiting reason."""

    tables = frozenset({"jobs"})
    reads = frozenset({"tenants"})  # each tenant's head and last start

    def __init__(self, database: Database, *, jobs: Jobs, events: Events, queue_changed: Signal):
        super().__init__(database)
        self._jobs, self._events, self._queue_changed = jobs, events, queue_changed

    def head(self, skip: Collection[str] = ()) -> JobRecord | None:
        """The next job to place: the head of the tenant whose turn it is (:func:`~cantata.server.jobs.fairness.turn`).

        Each tenant's head and active jobs are index seeks (``jobs_queue``, ``jobs_by_state``), so the look costs
        the same whatever the queue's length. Parked jobs (:meth:`park`), those in ``skip`` and those whose
        submission has not settled (:meth:`Jobs.settled`: placed once it has) are passed over.
        """
        skip = (*skip, *self._jobs.settling())
        with self.database.read() as db:
            heads = [
                QueueHead(r[0], r[1], r[5], r[2], r[3], r[4])
                for r in db.execute(queue_head_query(len(skip)), tuple(skip))
            ]
            return self._jobs.load(db, min(heads, key=turn).job_id) if heads else None

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
            return [self._jobs.load(db, i) for i in ids]

    def parked_verdicts(self) -> list[tuple[JobRecord, str]]:
        """One parked job of each distinct reason it was parked for, with that reason (one pass over jobs_parked)."""
        with self.database.read() as db:
            rows = db.execute(
                f"SELECT reason, MIN(rowid) AS first FROM jobs WHERE state={int(common_pb2.QUEUED)} AND parked=1 "
                "GROUP BY reason"
            ).fetchall()
            ids = [db.execute("SELECT id FROM jobs WHERE rowid=?", (r["first"],)).fetchone()[0] for r in rows]
            return [(self._jobs.load(db, job_id), r["reason"]) for job_id, r in zip(ids, rows, strict=True)]

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
            job = self._jobs.load(db, job_id)
            if job.state != common_pb2.QUEUED or job.reason == reason:
                return
            self._waiting(db, job, reason)

    def _waiting(self, db: sqlite3.Connection, job: JobRecord, reason: str) -> None:
        db.execute("UPDATE jobs SET reason=?, updated_at=? WHERE id=?", (reason, utcnow(), job.id))
        self._events.append_in(
            db,
            job.id,
            jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, total_steps=job.spec.steps, message=f"waiting: {reason}"),
        )
