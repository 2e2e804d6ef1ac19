"""Each job's worker processes: pids, start times, restarts, report cursors, rounds and gossip endpoints."""

from __future__ import annotations

import sqlite3

from cantata.server.store.base import Repository
from cantata.server.store.records import WorkerRecord


class Workers(Repository):
    """The current attempt's workers by (job, process index); calling it lists a job's workers."""

    tables = frozenset({"workers"})

    def set(self, job_id: str, pids: dict[int, int], started: dict[int, int] | None = None) -> None:
        """A new attempt's workers: process index -> pid, and each one's start time (clock ticks since boot)."""
        started = started or {}
        with self._tx() as db:
            db.execute("DELETE FROM workers WHERE job_id=?", (job_id,))
            db.executemany(
                "INSERT INTO workers (job_id, idx, pid, started_at) VALUES (?, ?, ?, ?)",
                [(job_id, i, pid, started.get(i, 0)) for i, pid in pids.items()],
            )

    def __call__(self, job_id: str) -> list[WorkerRecord]:
        """The job's workers, by process index."""
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

    def restart(self, job_id: str, idx: int) -> None:
        """A worker about to be relaunched: one restart more, no process yet (pid 0), no gossip endpoint until it
        registers again, its reports numbered anew. Recorded before the relaunch, so that an exit handled again
        (this write failed) relaunches nothing twice."""
        with self._tx() as db:
            db.execute(
                "UPDATE workers SET pid=0, started_at=0, restarts=restarts+1, failure='', gossip_address='', "
                "last_seq=0 WHERE job_id=? AND idx=?",
                (job_id, idx),
            )

    def relaunched(self, job_id: str, idx: int, pid: int, started_at: int = 0) -> None:
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

    def mark(self, job_id: str, idx: int, *, finished: bool = False, failure: str = "") -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE workers SET finished=MAX(finished, ?), failure=CASE WHEN ?='' THEN failure "
                "ELSE ? END WHERE job_id=? AND idx=?",
                (int(finished), failure, failure, job_id, idx),
            )

    def forget(self, db: sqlite3.Connection, job_id: str) -> None:
        """Delete the job's workers, in the caller's transaction ``db``."""
        db.execute("DELETE FROM workers WHERE job_id=?", (job_id,))
