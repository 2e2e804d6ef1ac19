"""Placement from the queue's heads: fair across tenants, and only when something changed. A real store,
fakes for the audit log and the processes (no workers start here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2 as pb
from cantata.server.executors import NotPlaceable
from cantata.server.heartbeats import Heartbeats
from cantata.server.lifecycle import JobLifecycle
from cantata.server.restarts import RestartPolicy
from cantata.server.scheduler import Scheduler
from cantata.server.store import UNFINISHED_OF_TENANT, JobRecord, Store, queue_head_query
from tests.test_resume_lifecycle import Audit, Workers


@dataclass
class Launcher:
    """The executor as the scheduler sees it: each launched job holds one of ``slots`` until ended here."""

    slots: int
    launched: list[str] = field(default_factory=list)

    def placement(self, job: JobRecord) -> None:
        if len(self.launched) >= self.slots:
            raise NotPlaceable("no free slot")

    def poll(self) -> list:
        return []

    def finished_jobs(self) -> list[str]:
        return []

    def running_workers(self) -> int:
        return len(self.launched)

    def is_running(self, job_id: str) -> bool:
        return False

    def live_workers(self) -> list[tuple[str, int, float]]:
        return []

    def launch(self, job: JobRecord, *, attack: dict | None = None) -> dict[int, int]:
        self.launched.append(job.id)
        return {0: 100 + len(self.launched)}


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "state.db")
    for tenant in ("busy", "small"):
        store.add_tenancy_request(tenant, b"csr", f"sha256:{tenant}")
        store.approve_tenant(tenant, f"sha256:{tenant}", b"cert", pb.Quota(max_concurrent_jobs=100), "root")
    yield store
    store.close()


def _submit(store: Store, tenant: str, n: int) -> list[str]:
    spec = pb.JobSpec(name="j", workers=1, ranks_per_worker=1, steps=10, batch_size=4, seq_len=16)
    return [store.submit_job(store.tenant(tenant), f"{tenant}-{i}", spec)[0].id for i in range(n)]


def _scheduler(store: Store, slots: int) -> tuple[Scheduler, Launcher]:
    launcher = Launcher(slots)
    lifecycle = JobLifecycle(store, Audit(), Workers(), restarts=RestartPolicy(0, 0.0, 0.0))  # type: ignore[arg-type]
    scheduler = Scheduler(store, launcher, lifecycle, Heartbeats(60))  # type: ignore[arg-type]
    store.on_queue_change = scheduler.wake
    return scheduler, launcher


def test_a_tenant_with_many_queued_jobs_does_not_starve_one_with_a_single_job(store):
    busy = _submit(store, "busy", 50)
    (small,) = _submit(store, "small", 1)  # queued after all of busy's
    scheduler, launcher = _scheduler(store, slots=3)
    scheduler.tick()
    assert launcher.launched == [busy[0], small, busy[1]]  # oldest first; then the tenant with fewer running
    assert store.job(small).state == pb.STARTING


def test_jobs_queued_in_the_same_millisecond_start_in_the_order_they_were_queued(store):
    busy = _submit(store, "busy", 20)
    with store.database.transaction() as db:  # on a fast machine a burst of submits shares one created_at
        db.execute("UPDATE jobs SET created_at = ?", ("2026-01-01T00:00:00.000+00:00",))
    scheduler, launcher = _scheduler(store, slots=20)
    scheduler.tick()
    assert launcher.launched == busy  # not in the order of their random ids


def test_placement_runs_on_a_change_and_not_on_every_tick(store):
    scheduler, launcher = _scheduler(store, slots=2)
    scheduler.tick()  # nothing queued: the first pass finds nothing
    (first,) = _submit(store, "busy", 1)  # queueing wakes the scheduler
    scheduler.tick()
    assert launcher.launched == [first]
    queued_quietly = store.queue_head
    looks: list[int] = []
    store.queue_head = lambda skip=(): looks.append(1) or queued_quietly(skip)  # type: ignore[method-assign]
    for _ in range(5):
        scheduler.tick()
    assert looks == []  # an idle tick does not look at the queue at all
    (second,) = _submit(store, "small", 1)
    scheduler.tick()
    assert launcher.launched == [first, second] and len(looks) >= 1


@pytest.mark.parametrize(
    "query",
    [queue_head_query(0), queue_head_query(2), UNFINISHED_OF_TENANT],
    ids=["queue head", "queue head passing two jobs over", "quota count"],
)
def test_the_looks_at_the_queue_seek_the_index_instead_of_scanning_the_jobs(store, query):
    _submit(store, "busy", 50)
    with store.database.read() as db:
        plan = [row["detail"] for row in db.execute("EXPLAIN QUERY PLAN " + query, ("busy",) * query.count("?"))]
    assert all(step.startswith("SCAN t") for step in plan if step.startswith("SCAN")), plan  # only the tenants
    assert any("COVERING INDEX jobs_by_state" in step for step in plan), plan
