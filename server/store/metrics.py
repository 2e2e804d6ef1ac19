"""Each job's metrics history: what its workers reported, one point per metric per report window.

A point is (seq, time, step, worker, name, value, peer). ``seq`` increases
with every point recorded (a cursor for readers that follow a running job);
``time`` is when the server recorded it (UNIX seconds); ``peer`` names the
other worker of a per-peer metric (gossip bytes, screening verdicts) and is
None otherwise. The names are :data:`METRICS`, a fixed vocabulary.

The history is bounded: a series (one job, name, worker and peer) keeps at
most :data:`SERIES_POINTS` points. When a long run passes that, every second
point but the newest is dropped, so the series still spans the whole run at
half the resolution, and keeps between half and all of the cap from then on.

Writes go through the server's one database (:meth:`Database.transaction`,
so a report's points commit with its other records); reads go through
:meth:`Database.read` and never wait on writers.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cantata.server.database import Database
from cantata.server.store.base import Repository

SERIES_POINTS = 1000  # the most points one series keeps; past it, every second older point is dropped
NO_PEER = -1  # the stored peer of a metric that is not per peer

# Every metric a job's history can hold, and what it means.
METRICS: dict[str, str] = {
    "loss": "training loss of the report window's last step",
    "val_loss": "validation loss",
    "lr": "learning rate",
    "tokens_per_s": "training throughput over the report window",
    "step_time_s": "mean seconds per step over the report window",
    "data_wait_s": "seconds the steps of the report window waited for data",
    "grad_norm": "gradient norm before clipping (only when clipping is on)",
    "optim_step_s": "mean seconds per optimizer step over the window (the slowest rank)",
    "optim_compute_s": "muon: mean seconds per step of the Newton-Schulz updates (the slowest rank)",
    "optim_compute_imbalance": "muon: max/mean over ranks of the Newton-Schulz update time in the window",
    "optim_sent_bytes": "bytes the optimizer's collectives sent per step, all ranks together",
    "optim_ns_flops_imbalance": "muon: max/mean over ranks of the Newton-Schulz FLOPs Canzona's plan gives each",
    "optim_owned_matrices": "muon: the most matrices one rank owns (updates whole)",
    "optim_updated_matrices": "muon: matrices the window's last step updated (those without a gradient are not)",
    "checkpoint_bytes": "size of a committed checkpoint",
    "checkpoint_s": "seconds the worker took to write its part of a checkpoint",
    "round_s": "seconds a decentralized round's exchange took",
    "round_peers": "peers a round mixed in",
    "round_skipped": "peers a round skipped (dead, late or malformed)",
    "bytes_sent": "gossip bytes the worker has sent so far (serialized messages)",
    "bytes_sent_to_peer": "payload bytes sent to one peer in a round",
    "bytes_received_from_peer": "payload bytes received from one peer in a round",
    "screen_clip": "an update from a peer clipped by screening (value: the check's score)",
    "screen_reject": "an update from a peer rejected by screening (value: the check's score)",
    "cpu_percent": "the worker process's CPU use between heartbeats (100: one core busy)",
    "memory_bytes": "the worker process's resident memory at a heartbeat",
    "gpu_memory_bytes": "memory the worker's tensors hold on its GPU at a heartbeat (GPU workers only)",
}
# The metrics a heartbeat carries (the worker's use of its machine), recorded at the job's step.
SYSTEM_METRICS = ("cpu_percent", "memory_bytes", "gpu_memory_bytes")


class UnknownMetric(ValueError):
    """A name that is not in :data:`METRICS`."""


@dataclass(frozen=True)
class MetricPoint:
    seq: int
    time: float  # UNIX seconds, when the server recorded the point
    step: int
    worker: int
    name: str
    value: float
    peer: int | None = None


def check_names(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as a tuple, or ``UnknownMetric`` naming the first that is not a metric."""
    names = tuple(names)
    for name in names:
        if name not in METRICS:
            raise UnknownMetric(f"unknown metric {name!r}: one of {', '.join(METRICS)}")
    return names


class MetricsStore(Repository):
    """Record a job's metrics and read them back: :meth:`record`, :meth:`rows`, :meth:`latest`."""

    tables = frozenset({"metrics"})

    def __init__(self, database: Database, series_points: int = SERIES_POINTS):
        super().__init__(database)
        self._cap = series_points

    def record(
        self, job_id: str, step: int, worker: int, values: Mapping[str, float], *, peer: int | None = None
    ) -> None:
        """Add one point per value (NaN is kept as a gap), then thin any series past the cap."""
        check_names(values)
        now = time.time()
        stored_peer = NO_PEER if peer is None else peer
        with self.database.transaction() as db:
            for name, value in values.items():
                db.execute(
                    "INSERT INTO metrics (job_id, name, worker, peer, step, time, value) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (job_id, name, worker, stored_peer, step, now, value if math.isfinite(value) else None),
                )
                self._thin(db, (job_id, name, worker, stored_peer))

    def _thin(self, db: sqlite3.Connection, series: tuple[str, str, int, int]) -> None:
        where = "job_id=? AND name=? AND worker=? AND peer=?"
        count = db.execute(f"SELECT COUNT(*) FROM metrics WHERE {where}", series).fetchone()[0]
        if count <= self._cap:
            return
        db.execute(
            f"DELETE FROM metrics WHERE seq IN (SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER "
            f"(ORDER BY step, seq) AS n FROM metrics WHERE {where}) WHERE n % 2 = 0 AND n < ?)",
            (*series, count),
        )

    def rows(
        self,
        job_id: str,
        names: Iterable[str] = (),
        since: float | None = None,
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[MetricPoint]:
        """The job's points, oldest first: only ``names`` (all when empty), recorded at or after ``since``
        (UNIX seconds), with ``seq`` past ``after``; at most ``limit`` of them."""
        clauses, args = ["job_id=?", "seq>?"], [job_id, after]
        names = check_names(names)
        if names:
            clauses.append(f"name IN ({', '.join('?' * len(names))})")
            args.extend(names)
        if since is not None:
            clauses.append("time>=?")
            args.append(since)
        query = f"SELECT * FROM metrics WHERE {' AND '.join(clauses)} ORDER BY seq"
        if limit is not None:
            query += " LIMIT ?"
            args.append(limit)
        with self.database.read() as db:
            return [_point(row) for row in db.execute(query, args)]

    def latest(self, job_ids: Iterable[str]) -> dict[str, dict[str, float]]:
        """Each job's newest value of every metric that is not per peer (worker 0's where several report it)."""
        result: dict[str, dict[str, float]] = {}
        with self.database.read() as db:
            for job_id in job_ids:
                rows = db.execute(
                    "SELECT name, value FROM metrics WHERE seq IN (SELECT MAX(seq) FROM metrics "
                    "WHERE job_id=? AND peer=? GROUP BY name, worker) ORDER BY worker DESC",
                    (job_id, NO_PEER),
                ).fetchall()
                result[job_id] = {r["name"]: _value(r["value"]) for r in rows}  # worker 0 written last: it wins
        return result

    def delete(self, job_id: str) -> None:
        """Forget the job's history (inside the caller's transaction when there is one)."""
        with self.database.transaction() as db:
            db.execute("DELETE FROM metrics WHERE job_id=?", (job_id,))


def _value(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _point(row: sqlite3.Row) -> MetricPoint:
    peer = None if row["peer"] == NO_PEER else row["peer"]
    return MetricPoint(row["seq"], row["time"], row["step"], row["worker"], row["name"], _value(row["value"]), peer)
