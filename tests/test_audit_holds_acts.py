"""An act whose audit record cannot be written does not happen: the lifecycle and the scheduler, on a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2 as pb
from cantata.security.audit import Action, AuditLogUnavailable
from cantata.server.executors import WorkerExit
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.jobs.restarts import RestartPolicy
from cantata.server.jobs.scheduler import Scheduler
from cantata.server.store import JobRecord, Store
from cantata.server.workers.heartbeats import Heartbeats
from testkit.fakes import FULL, FakeAudit, FakeExecutor, FakeWorkers

TENANT = "acme"


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "state.db")
    store.add_tenancy_request(TENANT, b"csr", "sha256:x")
    store.approve_tenant(TENANT, "sha256:x", b"cert", pb.Quota(), "root")
    yield store
    store.close()


@pytest.fixture
def audit() -> FakeAudit:
    return FakeAudit()


@pytest.fixture
def workers() -> FakeWorkers:
    return FakeWorkers()


@pytest.fixture
def lifecycle(store: Store, audit: FakeAudit, workers: FakeWorkers) -> JobLifecycle:
    return JobLifecycle(store, audit, workers, restarts=RestartPolicy(0, 0.0, 0.0))  # the first failure ends a job


def _submit(store: Store, request: str = "r-1") -> JobRecord:
    spec = pb.JobSpec(name="j", steps=10, workers=2, ranks_per_worker=1, algorithm="allreduce")
    return store.submit_job(store.tenant(TENANT), request, spec)[0]


def _running(lifecycle: JobLifecycle, store: Store, workers: FakeWorkers, job: JobRecord) -> JobRecord:
    assert lifecycle.placing(job)
    lifecycle.placed(job, {0: 1000, 1: 1001})
    workers.running[job.id] = 2
    lifecycle.worker_started(store.job(job.id), 0)
    return store.job(job.id)


def _events(store: Store, job_id: str) -> int:
    return len(store.events_after(job_id, 0))


def test_a_queued_job_is_not_cancelled_while_its_cancellation_cannot_be_recorded(lifecycle, store, audit):
    job = _submit(store)
    audit.refused = {Action.JOB_CANCELLED}  # the request is recorded, the disk fills before the cancellation is
    with pytest.raises(AuditLogUnavailable):
        lifecycle.cancel_requested(job, actor="spiffe://cantata/tenant/acme", peer="ipv4:127.0.0.1:1")
    assert (store.job(job.id).state, _events(store, job.id)) == (pb.QUEUED, 1)
    audit.refused = set()
    lifecycle.cancel_requested(store.job(job.id), actor="spiffe://cantata/tenant/acme", peer="ipv4:127.0.0.1:1")
    assert store.job(job.id).state == pb.CANCELLED
    assert audit.actions(job.id) == [Action.JOB_CANCEL_REQUESTED, Action.JOB_CANCEL_REQUESTED, Action.JOB_CANCELLED]


def test_a_start_that_cannot_be_recorded_records_no_workers_and_is_queued_again(lifecycle, store, audit):
    job = _submit(store)
    assert lifecycle.placing(job)
    audit.down = True
    with pytest.raises(AuditLogUnavailable):
        lifecycle.placed(job, {0: 1000, 1: 1001})
    assert store.workers(job.id) == []
    lifecycle.placement_deferred(job, FULL)
    assert store.job(job.id).state == pb.QUEUED and audit.actions(job.id) == []


def test_a_job_does_not_end_unrecorded_and_ends_once_the_log_is_back(lifecycle, store, audit, workers):
    job = _running(lifecycle, store, workers, _submit(store))
    for worker in (0, 1):
        lifecycle.worker_finished(store.job(job.id), worker, 1.0)
    audit.down = True
    with pytest.raises(AuditLogUnavailable):
        lifecycle.workers_exited(job.id)
    assert store.job(job.id).state == pb.RUNNING
    audit.down = False
    lifecycle.workers_exited(job.id)
    assert store.job(job.id).state == pb.SUCCEEDED
    assert audit.actions(job.id) == [Action.JOB_STARTED, Action.JOB_FINISHED]


def test_a_dead_worker_does_not_fail_its_job_unrecorded(lifecycle, store, audit, workers):
    job = _running(lifecycle, store, workers, _submit(store))
    audit.down = True
    with pytest.raises(AuditLogUnavailable):
        lifecycle.worker_exited(job.id, 1, 9)
    assert store.job(job.id).state == pb.RUNNING and workers.terminated == []


def test_the_scheduler_waits_while_the_log_is_down_and_then_settles_what_a_failed_record_left(
    lifecycle, store, audit, workers
):
    job = _running(lifecycle, store, workers, _submit(store))
    launcher = FakeExecutor(slots=0, exits=[WorkerExit(job.id, 1, 9)])
    scheduler = Scheduler(store, launcher, lifecycle, Heartbeats(60), audit_failure=audit.failure)
    audit.down = True
    scheduler.tick()
    assert launcher.polls == 1  # paused: the exit is reaped (the server's view follows it) but not judged
    assert store.job(job.id).state == pb.RUNNING and audit.actions(job.id) == [Action.JOB_STARTED]
    assert lifecycle.shown(store.job(job.id)).state == pb.RUNNING  # its other worker still runs

    audit.down = False
    original = audit.append
    audit.append = _fail_once(original)
    scheduler.tick()  # the disk fills again mid-tick: the exit is kept for the next tick
    assert store.job(job.id).state == pb.RUNNING
    scheduler.tick()  # the exit reaped by the failed tick is handled now
    assert store.job(job.id).state == pb.FAILED
    assert audit.actions(job.id) == [Action.JOB_STARTED, Action.JOB_FINISHED]


def _fail_once(append):
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise AuditLogUnavailable(FULL)
        return append(*args, **kwargs)

    return flaky


def test_a_job_whose_workers_all_exited_unrecorded_is_shown_queued_saying_why_until_its_end_is_recorded(
    lifecycle, store, audit, workers
):
    job = _running(lifecycle, store, workers, _submit(store))
    for worker in (0, 1):
        lifecycle.worker_finished(store.job(job.id), worker, 1.5)
    launcher = FakeExecutor(slots=0, exits=[WorkerExit(job.id, 0, 0), WorkerExit(job.id, 1, 0)], finished=[job.id])
    scheduler = Scheduler(store, launcher, lifecycle, Heartbeats(60), audit_failure=audit.failure)
    audit.down = True
    scheduler.tick()
    assert store.job(job.id).state == pb.RUNNING  # nothing recorded
    shown = lifecycle.shown(store.job(job.id))
    assert shown.state == pb.QUEUED
    assert (
        shown.reason == f"its workers exited; what that means for the job is recorded once the server can write: {FULL}"
    )

    audit.down = False
    scheduler.tick()
    assert store.job(job.id).state == pb.SUCCEEDED and launcher.released == [job.id]
    assert lifecycle.shown(store.job(job.id)).state == pb.SUCCEEDED
    assert audit.actions(job.id) == [Action.JOB_STARTED, Action.JOB_FINISHED]
