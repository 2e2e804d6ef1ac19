"""Placement from the queue's heads: fair across tenants, and only when something changed. A real store,
fakes for the audit log and the processes (no workers start here)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2 as pb
from cantata.server.executors import NotPlaceable
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.jobs.restarts import RestartPolicy
from cantata.server.jobs.scheduler import Scheduler
from cantata.server.store import UNFINISHED_OF_TENANT, JobRecord, Store, queue_head_query
from cantata.server.workers.heartbeats import Heartbeats
from testkit.fakes import FakeAudit, FakeExecutor, FakeWorkers


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "state.db")
    for tenant in ("busy", "small"):
        store.add_tenancy_request(tenant, b"csr", f"sha256:{tenant}")
        store.approve_tenant(tenant, f"sha256:{tenant}", b"cert", pb.Quota(max_concurrent_jobs=1000), "root")
    yield store
    store.close()


def _submit(store: Store, tenant: str, n: int, steps: int = 10) -> list[str]:
    spec = pb.JobSpec(name="j", workers=1, ranks_per_worker=1, steps=steps, batch_size=4, seq_len=16)
    with store.database.transaction():
        return [store.submit_job(store.tenant(tenant), uuid.uuid4().hex, spec)[0].id for _ in range(n)]


def _scheduler(store: Store, slots: int) -> tuple[Scheduler, FakeExecutor]:
    launcher = FakeExecutor(slots=slots)
    lifecycle = JobLifecycle(
        store,
        FakeAudit(),
        FakeWorkers(refuse_restart=AssertionError("not restarted here")),
        restarts=RestartPolicy(0, 0.0, 0.0),
    )
    scheduler = Scheduler(store, launcher, lifecycle, Heartbeats(60))
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
    store.queue_head = lambda skip=(): looks.append(1) or queued_quietly(skip)
    for _ in range(5):
        scheduler.tick()
    assert looks == []  # an idle tick does not look at the queue at all
    (second,) = _submit(store, "small", 1)
    scheduler.tick()
    assert launcher.launched == [first, second] and len(looks) >= 1


def test_jobs_that_can_never_run_are_parked_once_and_passed_in_the_index_until_their_reason_changes(store):
    scheduler, launcher = _scheduler(store, slots=5)
    launcher.most_steps = 100
    huge = _submit(store, "busy", 300, steps=500)  # more than one batch of parking
    (fits,) = _submit(store, "busy", 1)  # behind them all, in the same tenant
    scheduler.tick()
    assert launcher.launched == [fits]  # the jobs that can never run were passed over
    assert sorted(launcher.looked_at) == sorted([*huge, fits, fits])  # each that can never run, once
    assert all(store.job(j).reason == "needs 500 steps; this node runs at most 100" for j in huge)
    assert [e.message for e in store.events_after(huge[0], 0)][
        -1
    ] == "waiting: needs 500 steps; this node runs at most 100"
    launcher.looked_at.clear()
    (later,) = _submit(store, "busy", 1)  # a new job wakes a pass: it looks at the new head alone
    scheduler.tick()
    assert launcher.looked_at == [later] and launcher.launched == [fits, later]
    assert [r for _, r in store.parked_verdicts()] == ["needs 500 steps; this node runs at most 100"]
    launcher.looked_at.clear()
    scheduler._recheck_parked()  # the node as it was: one look for the 300, which stay parked
    assert len(launcher.looked_at) == 1
    scheduler.tick()
    assert launcher.launched == [fits, later]
    launcher.most_steps = 1000  # the node grew: the recheck offers them again, and they are placed in queue order
    scheduler._recheck_parked()
    scheduler.tick()
    assert launcher.launched == [fits, later, *huge[:3]]
    assert store.parked_verdicts() == []


def test_a_new_scheduler_rechecks_the_parked_jobs_at_its_first_tick(store):
    scheduler, launcher = _scheduler(store, slots=5)
    launcher.most_steps = 100
    huge = _submit(store, "busy", 3, steps=500)
    scheduler.tick()
    assert launcher.launched == [] and len(store.parked_verdicts()) == 1
    restarted, bigger = _scheduler(store, slots=5)  # the next server, on a node given more room
    bigger.most_steps = 1000
    restarted.tick()  # its first tick, not UNFIT_RECHECK_S later
    assert bigger.launched == huge and store.parked_verdicts() == []


@pytest.mark.parametrize(
    "query",
    [queue_head_query(0), queue_head_query(2), UNFINISHED_OF_TENANT],
    ids=["queue head", "queue head passing two jobs over", "quota count"],
)
def test_the_looks_at_the_queue_seek_the_index_instead_of_scanning_the_jobs(store, query):
    _submit(store, "busy", 50)
    with store.database.read() as db:
        plan = [row["detail"] for row in db.execute("EXPLAIN QUERY PLAN " + query, ("busy",) * query.count("?"))]
    scans = [step for step in plan if step.startswith("SCAN")]
    if query == UNFINISHED_OF_TENANT:  # one row, whatever the tenant's queue
        assert scans == ["SCAN CONSTANT ROW"], plan
        assert any("SEARCH unfinished_jobs USING PRIMARY KEY (tenant=?)" in step for step in plan), plan
    else:
        assert all(step.startswith("SCAN t") for step in scans), (
            plan
        )  # only the tenants  # each tenant's unparked head, and its active jobs, are seeks
        assert any("SEARCH q USING INDEX jobs_queue (tenant=?)" in step for step in plan), plan
        assert any("SEARCH a USING COVERING INDEX jobs_by_state" in step for step in plan), plan


def test_the_unfinished_count_the_quota_reads_follows_every_change_of_the_jobs(store):
    def counted(tenant: str) -> int:
        with store.database.read() as db:
            kept = db.execute(UNFINISHED_OF_TENANT, (tenant,)).fetchone()[0]
            actual = db.execute(
                "SELECT COUNT(*) FROM jobs WHERE state IN (1, 2, 3, 4) AND tenant=?", (tenant,)
            ).fetchone()[0]
        assert kept == actual, (kept, actual)
        return kept

    assert counted("busy") == 0
    jobs = _submit(store, "busy", 4)
    _submit(store, "small", 1)
    assert counted("busy") == 4 and counted("small") == 1
    store.transition(jobs[0], pb.STARTING)
    store.transition(jobs[0], pb.RUNNING)
    assert counted("busy") == 4
    store.transition(jobs[0], pb.SUCCEEDED)
    store.transition(jobs[1], pb.CANCELLED)
    assert counted("busy") == 2
    with pytest.raises(RuntimeError), store.database.transaction():  # a change rolled back is not counted
        store.transition(jobs[2], pb.FAILED)
        raise RuntimeError("rolled back")
    assert counted("busy") == 2
    store.resume_job(jobs[1], store.tenant("busy"), "resumed", before=lambda job: None)
    assert counted("busy") == 3
    store.undo_submission(jobs[3])
    store.delete_job(jobs[0], before=lambda job: None)  # an ended job: not counted before or after
    assert counted("busy") == 2 and counted("small") == 1


def test_a_launch_whose_room_was_taken_meanwhile_queues_the_job_again_instead_of_failing_it(store):
    (job,) = _submit(store, "busy", 1)
    scheduler, launcher = _scheduler(store, slots=2)
    taken = NotPlaceable("the resources free at placement were taken", retry=True)

    def launch_once_taken(job: JobRecord, *, attack: dict | None = None, fault: dict | None = None) -> dict[int, int]:
        launcher.launch = FakeExecutor.launch.__get__(launcher)
        raise taken

    launcher.launch = launch_once_taken
    scheduler.tick()
    assert store.job(job).state == pb.QUEUED
    assert store.job(job).reason == "waiting: the resources free at placement were taken"
    scheduler.tick()  # the next tick tries again, without a worker's exit to wake it
    assert launcher.launched == [job] and store.job(job).state == pb.STARTING


def test_when_slots_are_scarce_every_tenant_starts_its_first_job_before_any_tenant_starts_a_second(store):
    store.add_tenancy_request("third", b"csr", "sha256:third")
    store.approve_tenant("third", "sha256:third", b"cert", pb.Quota(max_concurrent_jobs=1000), "root")
    first = _submit(store, "busy", 3)  # busy queued all of its jobs first
    second = _submit(store, "small", 2)
    third = _submit(store, "third", 2)
    scheduler, launcher = _scheduler(store, slots=1)
    started: list[str] = []
    for _ in range(7):  # one slot: start one job, end it, start the next
        scheduler.tick()
        (running,) = launcher.launched
        started.append(running)
        store.transition(running, pb.SUCCEEDED)
        launcher.launched.clear()
        scheduler.wake()  # a worker's exit would
    assert started == [first[0], second[0], third[0], first[1], second[1], third[1], first[2]]


def test_the_turns_survive_a_restart_of_the_scheduler(store):
    first = _submit(store, "busy", 2)
    (small,) = _submit(store, "small", 1)
    scheduler, launcher = _scheduler(store, slots=1)
    scheduler.tick()
    assert launcher.launched == [first[0]]
    store.transition(first[0], pb.SUCCEEDED)
    restarted, relaunched = _scheduler(store, slots=1)  # the next server: the last start is in the database
    restarted.tick()
    assert relaunched.launched == [small]  # busy started most recently, though its next job was queued first
