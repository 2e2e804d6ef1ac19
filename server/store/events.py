"""Each job's events: its history of states, progress, checkpoints and messages, numbered in order."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.server.broadcast import EventBroadcast
from cantata.server.database import Database
from cantata.server.store.base import Repository, Signal


class Events(Repository):
    """Job events by (job, seq); each new one reaches the event streams once its commit is durable."""

    tables = frozenset({"events"})

    def __init__(self, database: Database, broadcast: EventBroadcast | None, queue_changed: Signal):
        super().__init__(database)
        self._broadcast = broadcast
        self._queue_changed = queue_changed
        # Called with each job event inside the transaction that writes it (the webhooks' outbox).
        self.on_event: Callable[[sqlite3.Connection, str, jobs_pb2.JobEvent], None] = lambda db, job_id, event: None

    def append(self, job_id: str, event: jobs_pb2.JobEvent) -> int:
        with self._tx() as db:
            return self.append_in(db, job_id, event)

    def append_in(self, db: sqlite3.Connection, job_id: str, event: jobs_pb2.JobEvent) -> int:
        """Append ``event`` in the caller's transaction ``db``; returns its seq."""
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

    def after(self, job_id: str, cursor: int) -> list[jobs_pb2.JobEvent]:
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

    def forget(self, db: sqlite3.Connection, job_id: str) -> None:
        """Delete the job's events, in the caller's transaction ``db``."""
        db.execute("DELETE FROM events WHERE job_id=?", (job_id,))
