"""Each repository of the store writes only its own tables, and reads only those and the ones it declares.

The statements the store's connections run are traced; each is charged to the innermost repository on the
call stack, and SQLite itself says which tables it reads and writes (its authorizer, while preparing it again
on a connection of the test's own). Triggers' statements are the schema's bookkeeping and are not charged.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import sys
from collections import defaultdict
from types import FrameType

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.security.audit import Unsigned
from cantata.server.database import Database
from cantata.server.datasource_store import DataSourceStore
from cantata.server.store import AnomalyRecord, Store, utcnow
from cantata.server.store.base import Repository
from cantata.server.store.workers import Workers
from cantata.server.sweeps.store import SweepStore
from cantata.server.webhooks.store import WebhookStore

WRITES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}


class Tracer:
    """The tables each repository's statements read and wrote, on one database, from this thread."""

    def __init__(self, database: Database):
        self._scratch = sqlite3.connect(database.path)
        self.schema = {r[0] for r in self._scratch.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        self._tables: dict[str, tuple[set[str], set[str]]] = {}
        self.reads: dict[type[Repository], set[str]] = defaultdict(set)
        self.writes: dict[type[Repository], set[str]] = defaultdict(set)
        self.errors: list[str] = []  # a trace callback cannot raise: what went wrong is kept for the test
        for connection in (database.connection, database._reader()):
            connection.set_trace_callback(self._statement)

    def _statement(self, sql: str) -> None:
        if sql.startswith("--"):  # a trigger's statement
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and not isinstance(frame.f_locals.get("self"), Repository):
            frame = frame.f_back
        if frame is None:  # the database's own (BEGIN, COMMIT, the migrations' PRAGMAs)
            return
        try:
            read, written = self._touched(sql)
        except sqlite3.Error as exc:
            self.errors.append(f"{sql}: {exc}")
            return
        repository = type(frame.f_locals["self"])
        self.reads[repository] |= read
        self.writes[repository] |= written

    def _touched(self, sql: str) -> tuple[set[str], set[str]]:
        """(read, written) tables of ``sql``, as SQLite's authorizer sees them while preparing it."""
        if sql not in self._tables:
            read: set[str] = set()
            written: set[str] = set()

            def authorize(action: int, table: str | None, column: str | None, db: str | None, inner: str | None) -> int:
                if table is None or inner is not None:
                    return sqlite3.SQLITE_OK
                if table in self.schema and action in WRITES:
                    written.add(table)
                elif table in self.schema and action == sqlite3.SQLITE_READ:
                    read.add(table)
                return sqlite3.SQLITE_OK

            self._scratch.set_authorizer(authorize)
            try:
                self._scratch.execute("EXPLAIN " + sql)
            finally:
                self._scratch.set_authorizer(None)
            self._tables[sql] = read, written
        return self._tables[sql]

    def trespasses(self) -> list[str]:
        """What a repository wrote outside its own tables, or read outside those and its declared reads."""
        found = [
            f"{r.__name__} writes {sorted(tables - r.tables)}" for r, tables in self.writes.items() if tables - r.tables
        ]
        found += [
            f"{r.__name__} reads {sorted(tables - r.tables - r.reads)}"
            for r, tables in self.reads.items()
            if tables - r.tables - r.reads
        ]
        return found


def use_every_repository(store: Store) -> None:
    """A tenant's life, two jobs' and a certificate's, through the store's names and its repositories."""
    store.add_tenancy_request("acme", b"csr", "sha256:a", source="10.0.0.1")
    store.add_tenancy_request("late", b"csr", "sha256:l")
    store.add_tenancy_request("nope", b"csr", "sha256:n")
    store.reject_tenant("nope")
    store.expire_pending(dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    store.approve_tenant("acme", "sha256:a", b"cert", common_pb2.Quota(max_concurrent_jobs=5, max_gpus=8), "root")
    store.set_quota("acme", common_pb2.Quota(max_total_steps=100))
    store.set_retention("acme", 1)
    store.set_tenant_certificate("acme", b"cert2")
    assert store.tenant_status("acme") == "APPROVED" and [t.name for t in store.tenants("APPROVED")] == ["acme"]
    store.set_tenant_status("acme", "SUSPENDED", expect="APPROVED")
    store.set_tenant_status("acme", "APPROVED", expect="SUSPENDED")

    store.record_certificate(0xA1, "acme", dt.datetime.now(dt.UTC))
    store.record_certificate(0xA2, "acme", dt.datetime.now(dt.UTC), renewed_from="a1")
    assert store.current_certificate("acme") is not None and store.renewals_of("a1") == ["a2"]
    store.revoke_certificate("a1")
    assert store.is_revoked(0xA2)

    tenant = store.tenant("acme")
    spec = common_pb2.JobSpec(name="j", steps=10, tags=["t"], gpus_per_worker=1)
    store.check_quota("acme", spec)
    job, _ = store.submit_job(tenant, "request-0001", spec, "digest", record=lambda job_id: 7)
    store.settled(job.id)
    other, _ = store.submit_job(tenant, "request-0002", spec)
    assert store.existing_jobs([job.id, "job-none"]) == {job.id}
    store.set_attack(job.id, "{}")
    store.set_fault(job.id, "{}")
    assert store.attack(job.id) == store.fault(job.id) == "{}"
    store.park([(other, "too big")])
    assert store.parked_verdicts()[0][1] == "too big" and store.unpark("too big") == 1
    store.set_waiting(other.id, "no room")
    assert store.queued_after(job, 5)[0].id == other.id
    assert store.queue_head().id == job.id
    store.undo_unrecorded(0, {7: Unsigned("job_cancelled", job.id, "acme", "ok")})  # not its submission: undone
    assert not store.job_active(job.id)
    job = other

    store.transition(job.id, common_pb2.STARTING)
    store.set_workers(job.id, {0: 100, 1: 101}, {0: 5})
    assert store.claim_report(job.id, 0, 1) is True
    store.set_round(job.id, 0, 3)
    store.set_gossip_address(job.id, 1, "127.0.0.1:1")
    store.restart_worker(job.id, 1)
    store.worker_relaunched(job.id, 1, 102, 6)
    store.mark_worker(job.id, 0, finished=True)
    assert store.rounds(job.id) == {0: 3, 1: 0} and store.latest_round(job.id) == 3
    assert [w.pid for w in store.workers(job.id)] == [100, 102]
    assert [j.id for j in store.jobs(tenant="acme", tag="t", with_workers=True, since="0", after="")] == [job.id]
    store.transition(job.id, common_pb2.RUNNING)
    store.record_progress(job.id, step=5, loss=1.0, val_loss=1.5)
    assert store.count_failure(job.id) == 1
    store.append_event(job.id, jobs_pb2.JobEvent(kind=jobs_pb2.CHECKPOINT, step=5))
    assert store.latest_checkpoint_step(job.id) == 5 and store.events_after(job.id, 0)
    store.add_anomaly(AnomalyRecord(job.id, 0, 1, 3, "norm", "clip", 2.0, False, utcnow()))
    assert store.anomalies(job.id)[0].verdict == "clip"
    store.metrics.record(job.id, 5, 0, {"loss": 1.0})
    store.transition(job.id, common_pb2.FAILED, "boom")
    assert store.resumed_after(job.id, 0)
    store.resume_job(job.id, tenant, "resumed", before=lambda job: None)
    store.transition(job.id, common_pb2.CANCELLED)
    assert store.job_counts() == {common_pb2.CANCELLED: 1}
    assert [j.id for j in store.expired_jobs(dt.datetime.now(dt.UTC) + dt.timedelta(days=2))] == [job.id]
    assert store.jobs.get(job.id).state == common_pb2.CANCELLED
    store.delete_job(job.id, before=lambda job: None)


def test_each_repository_touches_only_its_tables(tmp_path):
    store = Store(tmp_path / "state.db")
    tracer = Tracer(store.database)
    use_every_repository(store)
    assert tracer.errors == []
    repositories = {type(r) for r in vars(store).values() if isinstance(r, Repository)}
    assert set(tracer.reads) == repositories, "a repository went unused: the trace would not cover it"
    assert tracer.trespasses() == []


def test_every_table_has_one_owner(tmp_path):
    store = Store(tmp_path / "state.db")
    with store.database.read() as db:
        schema = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")} - {"sqlite_sequence"}
    owners = defaultdict(list)
    for repository in (
        *{type(r) for r in vars(store).values() if isinstance(r, Repository)},
        DataSourceStore,
        SweepStore,
        WebhookStore,
    ):
        for table in repository.tables:
            owners[table].append(repository.__name__)
        assert repository.reads <= schema
    assert set(owners) == schema
    # The queue is the queued rows of the jobs table: it writes their parked flag and reason.
    assert {table: sorted(names) for table, names in owners.items() if len(names) > 1} == {"jobs": ["Jobs", "Queue"]}


class Leaky(Workers):
    """A repository that reads and writes another's table, as a change that broke the boundary would."""

    def tenant_of(self, job_id: str) -> str:
        with self.database.read() as db:
            return db.execute("SELECT tenant FROM jobs WHERE id=?", (job_id,)).fetchone()[0]

    def fail(self, job_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET state=? WHERE id=?", (common_pb2.FAILED, job_id))


def test_a_repository_touching_another_aggregates_table_is_caught(tmp_path):
    store = Store(tmp_path / "state.db")
    store.add_tenancy_request("acme", b"csr", "sha256:a")
    store.approve_tenant("acme", "sha256:a", b"cert", common_pb2.Quota(), "root")
    job, _ = store.submit_job(store.tenant("acme"), "request-0001", common_pb2.JobSpec(name="j", steps=1))
    tracer = Tracer(store.database)
    leaky = Leaky(store.database)
    assert leaky.tenant_of(job.id) == "acme"
    leaky.fail(job.id)
    assert tracer.trespasses() == ["Leaky writes ['jobs']", "Leaky reads ['jobs']"]
