"""The sweeps table: one row per sweep, its spec as submitted and its state; scoped to the tenant."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cantata.proto.v1 import sweeps_pb2
from cantata.server.store import NotFound, RequestIdReused, utcnow
from cantata.server.store.base import Repository

TERMINAL = frozenset({sweeps_pb2.SWEEP_SUCCEEDED, sweeps_pb2.SWEEP_FAILED, sweeps_pb2.SWEEP_CANCELLED})


@dataclass(frozen=True)
class SweepRecord:
    id: str
    tenant: str
    request_id: str
    spec: sweeps_pb2.SweepSpec
    state: int
    reason: str
    active: bool  # the runner has work left: trials to start or settle, or a cancelled sweep's jobs to stop
    created_at: str
    updated_at: str

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


class SweepStore(Repository):
    """The tenants' sweeps, scoped to the tenant."""

    tables = frozenset({"sweeps"})

    def submit(
        self, tenant: str, request_id: str, spec: sweeps_pb2.SweepSpec, *, record: Callable[[str], object]
    ) -> tuple[SweepRecord, bool]:
        """Create the sweep with its audit record (``record(sweep_id)``, in the transaction), or return the one
        this request id already made (the same spec only: else :class:`RequestIdReused`); (sweep, created)."""
        with self.database.transaction() as db:
            row = db.execute("SELECT * FROM sweeps WHERE tenant=? AND request_id=?", (tenant, request_id)).fetchone()
            if row is not None:
                existing = _record(row)
                if existing.spec != spec:
                    raise RequestIdReused(request_id, existing.id)
                return existing, False
            sweep_id = "sweep-" + uuid.uuid4().hex[:16]
            now = utcnow()
            db.execute(
                "INSERT INTO sweeps (id, tenant, request_id, spec, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sweep_id, tenant, request_id, spec.SerializeToString(), sweeps_pb2.SWEEP_RUNNING, now, now),
            )
            record(sweep_id)
            return SweepRecord(sweep_id, tenant, request_id, spec, sweeps_pb2.SWEEP_RUNNING, "", True, now, now), True

    def sweep(self, sweep_id: str, *, tenant: str | None = None) -> SweepRecord:
        """The sweep; another tenant's is not found either."""
        with self.database.read() as db:
            row = db.execute("SELECT * FROM sweeps WHERE id=?", (sweep_id,)).fetchone()
        if row is None or (tenant is not None and row["tenant"] != tenant):
            raise NotFound(f"sweep {sweep_id!r} not found")
        return _record(row)

    def sweeps(self, tenant: str) -> list[SweepRecord]:
        """The tenant's sweeps, newest first."""
        with self.database.read() as db:
            rows = db.execute("SELECT * FROM sweeps WHERE tenant=? ORDER BY created_at DESC, id", (tenant,)).fetchall()
        return [_record(r) for r in rows]

    def active(self) -> list[SweepRecord]:
        """The sweeps the runner has work left in, oldest first."""
        with self.database.read() as db:
            rows = db.execute("SELECT * FROM sweeps WHERE active=1 ORDER BY created_at, id").fetchall()
        return [_record(r) for r in rows]

    def end(self, sweep_id: str, state: int, reason: str, *, before: Callable[[], object] = lambda: None) -> bool:
        """Move a running sweep to a terminal ``state`` (``before()`` writes its record in the transaction);
        False if it had ended already."""
        with self.database.transaction() as db:
            changed = db.execute(
                "UPDATE sweeps SET state=?, reason=?, updated_at=? WHERE id=? AND state=?",
                (state, reason, utcnow(), sweep_id, sweeps_pb2.SWEEP_RUNNING),
            ).rowcount
            if changed:
                before()
            return bool(changed)

    def set_reason(self, sweep_id: str, reason: str) -> None:
        """What a running sweep waits for now (a quota), or "" when it waits for nothing."""
        with self.database.transaction() as db:
            db.execute(
                "UPDATE sweeps SET reason=?, updated_at=? WHERE id=? AND state=? AND reason<>?",
                (reason, utcnow(), sweep_id, sweeps_pb2.SWEEP_RUNNING, reason),
            )

    def settle(self, sweep_id: str) -> None:
        """The runner has nothing left to do in this (ended) sweep."""
        with self.database.transaction() as db:
            db.execute("UPDATE sweeps SET active=0 WHERE id=?", (sweep_id,))


def _record(row) -> SweepRecord:
    return SweepRecord(
        row["id"],
        row["tenant"],
        row["request_id"],
        sweeps_pb2.SweepSpec.FromString(row["spec"]),
        row["state"],
        row["reason"],
        bool(row["active"]),
        row["created_at"],
        row["updated_at"],
    )
