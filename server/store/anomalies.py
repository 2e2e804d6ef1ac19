"""What the workers' screening of each other found: one row per check of a peer's update that was not clean."""

from __future__ import annotations

import sqlite3

from cantata.server.store.base import Repository
from cantata.server.store.records import AnomalyRecord


class Anomalies(Repository):
    """Anomalies in the order reported; calling it lists a job's."""

    tables = frozenset({"anomalies"})

    def add(self, a: AnomalyRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO anomalies VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (a.job_id, a.reporter, a.peer, a.round, a.check, a.verdict, a.score, int(a.quarantined), a.time),
            )

    def __call__(self, job_id: str) -> list[AnomalyRecord]:
        with self.database.read() as db:
            return [
                AnomalyRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8])
                for r in db.execute("SELECT * FROM anomalies WHERE job_id=? ORDER BY rowid", (job_id,))
            ]

    def forget(self, db: sqlite3.Connection, job_id: str) -> None:
        """Delete the job's anomalies, in the caller's transaction ``db``."""
        db.execute("DELETE FROM anomalies WHERE job_id=?", (job_id,))
