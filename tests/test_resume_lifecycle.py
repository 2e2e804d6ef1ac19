"""Resuming an ended job and killing a silent worker, on a real store and without processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2 as pb
from cantata.proto.v1 import jobs_pb2
from cantata.security.audit import Action
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.jobs.restarts import RestartPolicy
from cantata.server.jobs.scheduler import Scheduler
from cantata.server.store import JobRecord, NotResumable, QuotaExceeded, Store
from cantata.server.workers.heartbeats import Heartbeats
from testkit.fakes import FakeAudit, FakeExecutor, FakeWorkers

TENANT = "acme"
ACTOR = "spiffe://cantata/tenant/acme"


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "state.db")
    store.add_tenancy_request(TENANT, b"csr", "sha256:x")
    store.approve_tenant(TENANT, "sha256:x", b"cert", pb.Quota(max_concurrent_jobs=1), "root")
    yield store
    store.close()


@pytest.fixture
def audit() -> FakeAudit:
    return FakeAudit()


@pytest.fixture
def workers() -> FakeWorkers:
    return FakeWorkers(refuse_restart=AssertionError("not restarted here"))


@pytest.fixture
def lifecycle(store: Store, audit: FakeAudit, workers: FakeWorkers) -> JobLifecycle:
    return JobLifecycle(store, audit, workers, restarts=RestartPolicy(0, 0.0, 0.0))  # the first failure ends a job


_requests = iter(range(10**6))


def _submit(store: Store) -> JobRecord:
    spec = pb.JobSpec(name="j", steps=10, workers=2, ranks_per_worker=1, algorithm="allreduce")
    job, _ = store.submit_job(store.tenant(TENANT), f"request-{next(_requests):08d}", spec)
    return job


def _running(lifecycle: JobLifecycle, store: Store, workers: FakeWorkers) -> JobRecord:
    job = _submit(store)
    assert lifecycle.placing(job)
    lifecycle.placed(job, {0: 100, 1: 101})
    workers.running[job.id] = 2
    lifecycle.worker_started(store.job(job.id), 0)
    return store.job(job.id)


def _cancelled(lifecycle: JobLifecycle, store: Store, workers: FakeWorkers) -> JobRecord:
    job = _running(lifecycle, store, workers)
    lifecycle.cancel_requested(job, actor=ACTOR, peer="p")
    lifecycle.workers_exited(job.id)
    assert store.job(job.id).state == pb.CANCELLED
    return store.job(job.id)


def _resume(lifecycle: JobLifecycle, store: Store, job: JobRecord) -> None:
    lifecycle.resume_requested(store.job(job.id), actor=ACTOR, peer="ipv4:127.0.0.1:1")


def test_a_cancelled_job_is_queued_again_audited_first_with_its_attempts_renewed(lifecycle, store, workers, audit):
    job = _cancelled(lifecycle, store, workers)
    _resume(lifecycle, store, job)
    resumed = store.job(job.id)
    assert (resumed.state, resumed.reason, resumed.attempts, resumed.failures) == (pb.QUEUED, "resumed by tenant", 0, 0)
    record = audit.records[-1]
    assert (record["actor"], record["action"], record["resource"], record["details"]) == (
        ACTOR,
        Action.JOB_RESUMED,
        job.id,
        {"from": "CANCELLED"},
    )
    states = [(e.state, e.terminal, e.message) for e in store.events_after(job.id, 0) if e.kind == jobs_pb2.STATE]
    assert states[-2:] == [(pb.CANCELLED, True, "cancelled by tenant"), (pb.QUEUED, False, "resumed by tenant")]
    terminal = next(e.seq for e in store.events_after(job.id, 0) if e.terminal)
    assert store.resumed_after(job.id, terminal)
    assert lifecycle.placing(resumed)


def test_a_failed_job_can_be_resumed_but_not_a_succeeded_queued_or_running_one(lifecycle, store, workers):
    failed = _running(lifecycle, store, workers)
    lifecycle.worker_exited(failed.id, 1, 1)
    assert store.job(failed.id).state == pb.FAILED
    assert store.job(failed.id).failures == 1
    _resume(lifecycle, store, failed)
    assert (store.job(failed.id).state, store.job(failed.id).failures) == (pb.QUEUED, 0)  # a fresh failure budget
    with pytest.raises(NotResumable, match="is QUEUED and cannot be resumed"):
        _resume(lifecycle, store, failed)
    store.transition(failed.id, pb.CANCELLED, "cancelled")

    running = _running(lifecycle, store, workers)
    with pytest.raises(NotResumable, match="is RUNNING and cannot be resumed"):
        _resume(lifecycle, store, running)
    lifecycle.worker_finished(running, 0, 1.0)
    lifecycle.worker_finished(running, 1, 1.0)
    lifecycle.workers_exited(running.id)
    assert store.job(running.id).state == pb.SUCCEEDED
    with pytest.raises(NotResumable, match=r"SUCCEEDED and cannot be resumed .*nothing left to train"):
        _resume(lifecycle, store, running)
    assert store.job(running.id).state == pb.SUCCEEDED


def test_resume_counts_against_the_concurrent_jobs_quota(lifecycle, store, workers, audit):
    job = _cancelled(lifecycle, store, workers)
    other = _submit(store)  # the tenant's one concurrent job
    with pytest.raises(QuotaExceeded) as refused:
        _resume(lifecycle, store, job)
    assert (refused.value.what, refused.value.limit, refused.value.used) == ("concurrent jobs", 1, 1)
    assert store.job(job.id).state == pb.CANCELLED
    assert Action.JOB_RESUMED not in [r["action"] for r in audit.records]
    store.transition(other.id, pb.CANCELLED, "cancelled")
    _resume(lifecycle, store, job)
    assert store.job(job.id).state == pb.QUEUED


def test_a_resume_that_cannot_be_audited_does_not_happen(lifecycle, store, workers, audit):
    job = _cancelled(lifecycle, store, workers)
    events = len(store.events_after(job.id, 0))
    audit.fail = OSError("No space left on device")
    with pytest.raises(OSError, match="No space left"):
        _resume(lifecycle, store, job)
    assert store.job(job.id).state == pb.CANCELLED
    assert len(store.events_after(job.id, 0)) == events


def test_a_silent_worker_of_a_started_job_is_killed_with_an_event(lifecycle, store, workers):
    job = _running(lifecycle, store, workers)
    lifecycle.worker_silent(job.id, 1, 3.25)
    assert workers.killed == [(job.id, 1)]
    last = store.events_after(job.id, 0)[-1]
    assert (last.kind, last.worker, last.message) == (
        jobs_pb2.MESSAGE,
        1,
        "worker 1 sent no heartbeat for 3.2 s; killed",
    )
    lifecycle.worker_finished(store.job(job.id), 0, 1.0)
    lifecycle.worker_silent(job.id, 0, 9.0)  # it finished: exiting slowly is not hanging
    lifecycle.cancel_requested(store.job(job.id), actor=ACTOR, peer="p")
    lifecycle.worker_silent(job.id, 1, 9.0)  # cancelling: the grace period's SIGKILL is already on its way
    assert workers.killed == [(job.id, 1)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_heartbeats_count_from_the_start_until_a_first_report_and_forget_ended_workers():
    clock = Clock()
    beats = Heartbeats(3.0, clock=clock)
    assert beats.interval == 0.75
    live = [("job-a", 0, 1000.0), ("job-a", 1, 1000.0)]
    clock.now = 1002.0
    beats.seen("job-a", 0)
    assert beats.silent(live) == []
    clock.now = 1003.5
    assert beats.silent(live) == [("job-a", 1, 3.5)]  # never reported: silent since its start
    clock.now = 1005.5
    assert beats.silent(live) == [("job-a", 0, 3.5), ("job-a", 1, 5.5)]
    restarted = [("job-a", 0, 1005.0)]  # a report from before a restart does not count
    assert beats.silent(restarted) == []
    clock.now = 1008.5
    assert beats.silent(restarted) == [("job-a", 0, 3.5)]
    assert beats.silent([]) == [] and beats.silent([("job-a", 1, 1008.0)]) == []  # ended workers were forgotten


def test_a_job_resumed_while_its_earlier_workers_stop_waits_for_them(lifecycle, store, workers):
    job = _running(lifecycle, store, workers)
    lifecycle.worker_exited(job.id, 1, 1)  # FAILED; its worker 0 is being terminated
    _resume(lifecycle, store, job)
    launcher = FakeExecutor(running={job.id: 1})
    # As in the server, the launcher is both the scheduler's and the lifecycle's view of the processes.
    placing = JobLifecycle(store, FakeAudit(), launcher, restarts=RestartPolicy(0, 0.0, 0.0))
    scheduler = Scheduler(store, launcher, placing, Heartbeats(60))
    scheduler.tick()
    assert launcher.launched == [] and store.job(job.id).state == pb.QUEUED
    launcher.running.clear()
    scheduler.tick()
    assert launcher.launched == [job.id] and store.job(job.id).state == pb.STARTING
