"""Every path of a job's lifecycle, on a real store and without processes: one terminal state, one terminal record."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cantata.proto.v1 import common_pb2 as pb
from cantata.proto.v1 import jobs_pb2
from cantata.security.audit import Action
from cantata.server.database import DatabaseUnavailable
from cantata.server.datasource_store import DataSourceNotFound
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.jobs.restarts import RestartPolicy
from cantata.server.store import AnomalyRecord, JobRecord, Store, utcnow
from testkit.fakes import FakeAudit, FakeWorkers
from tests.fullfs import fill, small_tmpfs

MAX_RESTARTS = 2  # the server's bound on max_failures
BACKOFF, MAX_BACKOFF = 1.0, 3.0
INTERRUPTIONS = 5  # server restarts a job lives through: more than any budget here
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


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def lifecycle(store: Store, audit: FakeAudit, workers: FakeWorkers, clock: Clock) -> JobLifecycle:
    return JobLifecycle(store, audit, workers, restarts=RestartPolicy(MAX_RESTARTS, BACKOFF, MAX_BACKOFF), clock=clock)


_requests = iter(range(10**6))


def _submit(store: Store, **spec: Any) -> JobRecord:
    fields = {"name": "j", "steps": 10, "workers": 2, "ranks_per_worker": 1, "algorithm": "allreduce", **spec}
    job, _ = store.submit_job(store.tenant(TENANT), f"request-{next(_requests):08d}", pb.JobSpec(**fields))
    return job


def _started(lifecycle: JobLifecycle, store: Store, workers: FakeWorkers, job: JobRecord) -> JobRecord:
    """Place the job and let worker 0 report it started: RUNNING with every process alive."""
    assert lifecycle.placing(job)
    n = job.spec.workers * job.spec.ranks_per_worker
    lifecycle.placed(job, {i: 1000 + i for i in range(n)})
    workers.running[job.id] = n
    lifecycle.worker_started(store.job(job.id), 0)
    return store.job(job.id)


def _state_events(store: Store, job_id: str) -> list[jobs_pb2.JobEvent]:
    return [e for e in store.events_after(job_id, 0) if e.kind == jobs_pb2.STATE]


def _ended(store: Store, job_id: str, state: int, reason: str) -> None:
    """The job is in ``state`` with ``reason``, and its events hold exactly one terminal event, the last."""
    job = store.job(job_id)
    assert (pb.JobState.Name(job.state), job.reason) == (pb.JobState.Name(state), reason)
    events = _state_events(store, job_id)
    assert [e.terminal for e in events].count(True) == 1 and events[-1].terminal
    assert events[-1].state == state


def _exit(lifecycle: JobLifecycle, workers: FakeWorkers, job: JobRecord, worker: int, code: int) -> None:
    workers.running[job.id] -= 1
    lifecycle.worker_exited(job.id, worker, code)


def _all_exit(lifecycle: JobLifecycle, workers: FakeWorkers, job: JobRecord) -> None:
    workers.running.pop(job.id, None)
    lifecycle.workers_exited(job.id)


# ---- success and failure of a job that runs ----------------------------------


def test_a_job_whose_workers_all_finish_succeeds(lifecycle, store, audit, workers):
    job = _submit(store)
    assert lifecycle.placing(job)
    assert store.job(job.id).state == pb.STARTING and store.job(job.id).attempts == 1
    lifecycle.placed(job, {0: 11, 1: 12})
    assert [w.pid for w in store.workers(job.id)] == [11, 12]
    workers.running[job.id] = 2
    lifecycle.worker_started(store.job(job.id), 1)
    assert store.job(job.id).state == pb.STARTING  # only worker 0 speaks for the job
    lifecycle.worker_started(store.job(job.id), 0)
    assert store.job(job.id).state == pb.RUNNING
    lifecycle.worker_finished(store.job(job.id), 0, final_val_loss=1.5)
    lifecycle.worker_finished(store.job(job.id), 1, final_val_loss=9.0)
    assert (store.job(job.id).step, store.job(job.id).val_loss) == (10, 1.5)  # worker 0's result is the job's
    for i in (0, 1):
        _exit(lifecycle, workers, job, i, 0)
    assert store.job(job.id).state == pb.RUNNING  # a clean exit decides nothing until all are gone
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.SUCCEEDED, "")
    assert audit.of(job.id) == [
        (Action.JOB_STARTED, {"workers": 2}),
        (Action.JOB_FINISHED, {"state": "SUCCEEDED", "reason": ""}),
    ]


def test_workers_that_exit_cleanly_without_finishing_fail_the_job(lifecycle, store, audit, workers):
    job = _started(lifecycle, store, workers, _submit(store))
    lifecycle.worker_finished(job, 0, final_val_loss=1.0)
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.FAILED, "workers exited without finishing")
    assert audit.of(job.id)[-1] == (
        Action.JOB_FINISHED,
        {"state": "FAILED", "reason": "workers exited without finishing"},
    )


@pytest.mark.parametrize(
    ("reported", "log", "detail"),
    [
        ("CUDA out of memory", "last log line", "CUDA out of memory"),
        ("", "last log line", "last log line"),
        ("", "", "no output"),
    ],
)
def test_a_failed_worker_fails_an_allreduce_job_with_its_reason(
    lifecycle, store, audit, workers, reported, log, detail
):
    job = _started(lifecycle, store, workers, _submit(store, max_failures=0))
    if reported:
        lifecycle.worker_failed(job, 1, reported)
    workers.logs[(job.id, 1)] = log
    _exit(lifecycle, workers, job, 1, 3)
    reason = f"worker 1 exited with code 3: {detail}; gave up after 1 failure (max_failures=0)"
    _ended(store, job.id, pb.FAILED, reason)
    assert workers.scrubbed == [job.id] and workers.terminated == [job.id]  # secrets go, the others are stopped
    _all_exit(lifecycle, workers, job)  # the rest exiting later changes nothing
    _ended(store, job.id, pb.FAILED, reason)
    assert audit.of(job.id) == [
        (Action.JOB_STARTED, {"workers": 2}),
        (Action.JOB_FINISHED, {"state": "FAILED", "reason": reason}),
    ]
    assert workers.relaunched == []  # an all-reduce job restarts no worker


# ---- all-reduce and single jobs restart within their budget --------------------


def _checkpoint(store: Store, job: JobRecord, step: int) -> None:
    store.append_event(job.id, jobs_pb2.JobEvent(kind=jobs_pb2.CHECKPOINT, step=step))


def test_a_failed_worker_restarts_the_job_from_its_latest_checkpoint(lifecycle, store, audit, workers, clock):
    job = _started(lifecycle, store, workers, _submit(store, max_failures=2))
    _checkpoint(store, job, 4)
    _checkpoint(store, job, 8)
    _exit(lifecycle, workers, job, 1, -9)
    reason = "worker 1 exited with code -9: no output"
    job = store.job(job.id)
    assert (job.state, job.reason, job.failures) == (pb.QUEUED, "restarting from step 8 after failure 1/2", 1)
    assert _messages(store, job.id) == [f"{reason}; restarting the job from step 8 (attempt 1/2)"]
    assert audit.of(job.id)[-1] == (
        Action.JOB_RESTARTED,
        {"failures": 1, "max_failures": 2, "from_step": 8, "reason": reason},
    )
    assert workers.terminated == [job.id] and workers.relaunched == []  # the whole group goes, to start again
    _exit(lifecycle, workers, job, 0, -15)  # the others, stopped, are no further failure
    assert store.job(job.id).failures == 1
    assert not lifecycle.due(job)  # its last workers are still there
    _all_exit(lifecycle, workers, job)
    assert not lifecycle.due(job)  # and then the backoff
    clock.now += BACKOFF
    assert lifecycle.due(job)
    job = _started(lifecycle, store, workers, store.job(job.id))
    assert (job.state, job.attempts) == (pb.RUNNING, 2)
    for i in (0, 1):
        lifecycle.worker_finished(store.job(job.id), i, final_val_loss=1.0)
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.SUCCEEDED, "")
    assert [a for a, _ in audit.of(job.id)] == [
        Action.JOB_STARTED,
        Action.JOB_RESTARTED,
        Action.JOB_STARTED,
        Action.JOB_FINISHED,
    ]


def test_a_worker_lost_with_its_node_restarts_an_allreduce_job_without_counting_a_failure(
    lifecycle, store, audit, workers, clock
):
    job = _started(lifecycle, store, workers, _submit(store, max_failures=0))  # no failure allowed at all
    _checkpoint(store, job, 6)
    workers.running[job.id] -= 1
    lifecycle.worker_exited(job.id, 1, -9, node_lost=True)
    job = store.job(job.id)
    assert (job.state, job.reason, job.failures) == (pb.QUEUED, "restarting from step 6 after its node was lost", 0)
    message = "worker 1 was lost with its node; restarting the job from step 6 (not counted: 0/0 failures)"
    assert _messages(store, job.id) == [message]
    assert workers.terminated == [job.id]
    _all_exit(lifecycle, workers, job)
    clock.now += BACKOFF
    job = _started(lifecycle, store, workers, store.job(job.id))
    assert (job.state, job.attempts, job.failures) == (pb.RUNNING, 2, 0)
    _exit(lifecycle, workers, job, 0, 1)  # a failure of the job itself still counts, and this one is over budget
    assert store.job(job.id).state == pb.FAILED


def _fail_repeatedly(lifecycle, store, workers, clock, job: JobRecord, times: int) -> list[float]:
    """Kill worker 0 of each attempt ``times`` times; returns the backoff each restart waited."""
    waits = []
    for _ in range(times):
        job = _started(lifecycle, store, workers, store.job(job.id))
        _exit(lifecycle, workers, job, 0, 1)
        _all_exit(lifecycle, workers, job)
        if store.job(job.id).state != pb.QUEUED:
            break
        start = clock.now
        while not lifecycle.due(store.job(job.id)):
            clock.now += 0.5
        waits.append(clock.now - start)
    return waits


def test_a_job_fails_once_it_had_more_failures_than_its_budget(lifecycle, store, audit, workers, clock):
    job = _submit(store, max_failures=2)
    assert _fail_repeatedly(lifecycle, store, workers, clock, job, 3) == [BACKOFF, 2 * BACKOFF]
    _ended(
        store, job.id, pb.FAILED, "worker 0 exited with code 1: no output; gave up after 3 failures (max_failures=2)"
    )
    assert [a for a, _ in audit.of(job.id)].count(Action.JOB_RESTARTED) == 2
    assert audit.of(job.id)[-1] == (Action.JOB_FINISHED, {"state": "FAILED", "reason": store.job(job.id).reason})


def test_the_server_bounds_a_jobs_budget_and_caps_the_backoff(store, audit, workers, clock):
    lifecycle = JobLifecycle(store, audit, workers, restarts=RestartPolicy(4, BACKOFF, MAX_BACKOFF), clock=clock)
    job = _submit(store, max_failures=100)
    assert _fail_repeatedly(lifecycle, store, workers, clock, job, 5) == [1.0, 2.0, 3.0, 3.0]
    assert store.job(job.id).reason.endswith("gave up after 5 failures (max_failures=4)")


def test_a_job_without_max_failures_has_the_default_budget(store, audit, workers, clock):
    lifecycle = JobLifecycle(store, audit, workers, restarts=RestartPolicy(10, 0.0, 0.0), clock=clock)
    job = _submit(store)  # as stored before the field existed
    assert _fail_repeatedly(lifecycle, store, workers, clock, job, 4) == [0.0, 0.0, 0.0]
    assert store.job(job.id).reason.endswith("gave up after 4 failures (max_failures=3)")


def test_a_permanent_failure_ends_the_job_without_a_restart(lifecycle, store, audit, workers):
    job = _started(lifecycle, store, workers, _submit(store))
    lifecycle.worker_failed(job, 1, "DataError: no training window", permanent=True)
    _exit(lifecycle, workers, job, 0, 1)  # its peer may be seen exiting first
    reason = "worker 0 exited with code 1: no output; not restarted: the error is permanent"
    _ended(store, job.id, pb.FAILED, reason)
    assert (store.job(job.id).failures, workers.terminated) == (0, [job.id])
    assert Action.JOB_RESTARTED not in [a for a, _ in audit.of(job.id)]


def test_a_transient_failure_reported_by_the_worker_restarts_the_job(lifecycle, store, workers):
    job = _started(lifecycle, store, workers, _submit(store))
    lifecycle.worker_failed(job, 0, "StoreUnavailableError: s3 timed out")
    _exit(lifecycle, workers, job, 0, 1)
    assert store.job(job.id).state == pb.QUEUED
    assert _messages(store, job.id) == [
        "worker 0 exited with code 1: StoreUnavailableError: s3 timed out; restarting the job from step 0 (attempt 1/2)"
    ]


def test_restart_is_for_started_jobs_only(lifecycle, store, workers):
    job = _submit(store)
    assert not lifecycle.restart(job.id, "worker 0 stopped responding")
    _started(lifecycle, store, workers, job)
    assert lifecycle.restart(job.id, "worker 0 stopped responding")  # what the heartbeat calls for a hung worker
    assert not lifecycle.restart(job.id, "worker 1 stopped responding")  # already restarting: one failure
    assert store.job(job.id).failures == 1
    assert _messages(store, job.id) == ["worker 0 stopped responding; restarting the job from step 0 (attempt 1/2)"]


def test_cancelling_a_job_that_waits_to_restart_ends_it(lifecycle, store, audit, workers):
    job = _started(lifecycle, store, workers, _submit(store))
    _exit(lifecycle, workers, job, 0, 1)
    lifecycle.cancel_requested(store.job(job.id), actor="spiffe://cantata/tenant/acme", peer="")
    _ended(store, job.id, pb.CANCELLED, "cancelled by tenant")
    _all_exit(lifecycle, workers, job)  # its last workers going changes nothing
    _ended(store, job.id, pb.CANCELLED, "cancelled by tenant")
    assert [a for a, _ in audit.of(job.id)][-1] == Action.JOB_CANCELLED


def test_an_exit_clears_the_workers_gossip_address(lifecycle, store, workers):
    job = _started(lifecycle, store, workers, _submit(store, algorithm="gasloc", min_workers=1))
    store.set_gossip_address(job.id, 1, "127.0.0.1:5000")
    _exit(lifecycle, workers, job, 1, 0)
    assert [w.gossip_address for w in store.workers(job.id)] == ["", ""]
    assert store.job(job.id).state == pb.RUNNING


# ---- decentralized jobs outlive workers --------------------------------------


def _decentralized(lifecycle, store, workers, **spec) -> JobRecord:
    return _started(lifecycle, store, workers, _submit(store, algorithm="gasloc", workers=3, min_workers=2, **spec))


def _messages(store: Store, job_id: str) -> list[str]:
    return [e.message for e in store.events_after(job_id, 0) if e.kind == jobs_pb2.MESSAGE]


def test_a_dead_decentralized_worker_is_restarted_up_to_max_restarts(lifecycle, store, audit, workers):
    job = _decentralized(lifecycle, store, workers)
    for attempt in range(1, MAX_RESTARTS + 1):
        _exit(lifecycle, workers, job, 2, 9)
        workers.running[job.id] += 1  # relaunched
        assert store.workers(job.id)[2].restarts == attempt
        assert store.workers(job.id)[2].pid == 2002
    assert workers.relaunched == [(job.id, 2)] * MAX_RESTARTS
    assert _messages(store, job.id) == [
        f"worker 2 exited with code 9: no output; restarting it ({n}/{MAX_RESTARTS})" for n in (1, 2)
    ]
    _exit(lifecycle, workers, job, 2, 9)  # restarts spent: 2 of 3 groups alive is still the quorum
    assert (
        _messages(store, job.id)[-1]
        == "worker 2 exited with code 9: no output; continuing with 2 of 3 worker processes"
    )
    assert store.job(job.id).state == pb.RUNNING
    for i in (0, 1):
        lifecycle.worker_finished(store.job(job.id), i, final_val_loss=1.0)
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.SUCCEEDED, "")  # min_workers groups finished: enough
    assert [a for a, _ in audit.of(job.id)] == [Action.JOB_STARTED, Action.JOB_FINISHED]


def test_a_decentralized_jobs_max_failures_bounds_each_workers_restarts(lifecycle, store, audit, workers):
    job = _decentralized(lifecycle, store, workers, max_failures=1)
    _exit(lifecycle, workers, job, 2, 9)
    workers.running[job.id] += 1
    _exit(lifecycle, workers, job, 2, 9)
    assert workers.relaunched == [(job.id, 2)]
    assert _messages(store, job.id) == [
        "worker 2 exited with code 9: no output; restarting it (1/1)",
        "worker 2 exited with code 9: no output; continuing with 2 of 3 worker processes",
    ]
    assert Action.JOB_RESTARTED not in [a for a, _ in audit.of(job.id)]  # the job itself never stopped


NO_CONSENSUS = "ConsensusFailed: worker 2: the final average failed (the ring [0, 1, 2] failed at step 0: no chunk)"


def test_a_decentralized_worker_whose_final_average_failed_fails_the_job_unrestarted(lifecycle, store, audit, workers):
    job = _decentralized(lifecycle, store, workers)
    for i in (0, 1):  # its peers finished: what they hold is no consensus of the job either way
        lifecycle.worker_finished(store.job(job.id), i, final_val_loss=1.0)
    lifecycle.worker_failed(store.job(job.id), 2, NO_CONSENSUS, permanent=True)
    _exit(lifecycle, workers, job, 2, 1)
    _ended(
        store, job.id, pb.FAILED, f"worker 2 exited with code 1: {NO_CONSENSUS}; not restarted: the error is permanent"
    )
    assert workers.relaunched == [] and workers.terminated == [job.id]
    _all_exit(lifecycle, workers, job)  # the others' exits change nothing
    assert store.job(job.id).state == pb.FAILED


def test_a_decentralized_workers_permanent_failure_is_its_own(lifecycle, store, workers):
    job = _decentralized(lifecycle, store, workers)
    lifecycle.worker_failed(store.job(job.id), 2, NO_CONSENSUS, permanent=True)
    _exit(lifecycle, workers, job, 1, 9)  # another worker's crash is restarted as before
    assert workers.relaunched == [(job.id, 1)] and store.job(job.id).state == pb.RUNNING


def test_a_quarantined_worker_whose_final_average_failed_is_left_out_of_the_job(lifecycle, store, audit, workers):
    job = _decentralized(lifecycle, store, workers)
    store.add_anomaly(AnomalyRecord(job.id, 0, 2, 4, "norm", "reject", 9.5, True, utcnow()))
    for i in (0, 1):
        lifecycle.worker_finished(store.job(job.id), i, final_val_loss=1.0)
    lifecycle.worker_failed(store.job(job.id), 2, NO_CONSENSUS, permanent=True)
    _exit(lifecycle, workers, job, 2, 1)
    assert workers.relaunched == [] and store.job(job.id).state == pb.RUNNING
    assert _messages(store, job.id)[-1] == (
        f"worker 2 exited with code 1: {NO_CONSENSUS}; not restarted: its peers quarantined it, "
        "and their consensus is the job's"
    )
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.SUCCEEDED, "")  # min_workers=2 groups finished in their consensus


def test_a_decentralized_job_whose_workers_all_failed_their_final_average_names_them(lifecycle, store, workers):
    job = _decentralized(lifecycle, store, workers)
    for i in range(3):  # each quarantined by another: none is restarted, none finished
        store.add_anomaly(AnomalyRecord(job.id, (i + 1) % 3, i, 4, "norm", "reject", 9.5, True, utcnow()))
        lifecycle.worker_failed(store.job(job.id), i, NO_CONSENSUS.replace("worker 2", f"worker {i}"), permanent=True)
        _exit(lifecycle, workers, job, i, 1)
    _all_exit(lifecycle, workers, job)
    said = "; ".join(f"worker {i}: {NO_CONSENSUS.replace('worker 2', f'worker {i}')}" for i in range(3))
    _ended(store, job.id, pb.FAILED, f"workers exited without finishing; {said}")


def test_a_worker_whose_data_source_is_gone_is_not_restarted(lifecycle, store, workers):
    job = _decentralized(lifecycle, store, workers)
    workers.refuse_restart = DataSourceNotFound("data source 'corpus' not found")
    _exit(lifecycle, workers, job, 0, 1)
    assert workers.relaunched == [] and store.workers(job.id)[0].restarts == 1  # recorded before it was tried
    assert _messages(store, job.id) == [
        "worker 0 exited with code 1: no output; cannot restart it: data source 'corpus' not found; "
        "continuing with 2 of 3 worker processes"
    ]
    assert store.job(job.id).state == pb.RUNNING


def test_a_decentralized_job_below_its_quorum_fails(lifecycle, store, audit, workers):
    job = _decentralized(lifecycle, store, workers)
    workers.refuse_restart = DataSourceNotFound("gone")
    _exit(lifecycle, workers, job, 0, 1)
    _exit(lifecycle, workers, job, 1, 1)
    reason = "worker 1 exited with code 1: no output; cannot restart it: gone; fewer than min_workers=2 worker groups are left"
    _ended(store, job.id, pb.FAILED, reason)
    assert workers.terminated == [job.id] and workers.scrubbed == [job.id]
    assert audit.of(job.id)[-1] == (Action.JOB_FINISHED, {"state": "FAILED", "reason": reason})


def test_a_decentralized_job_with_too_few_finished_groups_fails(lifecycle, store, workers):
    job = _decentralized(lifecycle, store, workers)
    lifecycle.worker_finished(job, 0, final_val_loss=1.0)
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.FAILED, "workers exited without finishing")


# ---- placement that does not get to run ---------------------------------------


def test_a_job_that_cannot_start_its_workers_fails(lifecycle, store, audit):
    job = _submit(store)
    assert lifecycle.placing(job)
    lifecycle.launch_failed(job, OSError("no such file"))
    _ended(store, job.id, pb.FAILED, "could not start workers: no such file")
    assert audit.of(job.id) == [
        (Action.JOB_FINISHED, {"state": "FAILED", "reason": "could not start workers: no such file"})
    ]


def test_placing_a_job_that_is_no_longer_queued_does_nothing(lifecycle, store):
    job = _submit(store)
    store.transition(job.id, pb.CANCELLED, "gone")
    assert not lifecycle.placing(job)
    _ended(store, job.id, pb.CANCELLED, "gone")


# ---- cancellation ---------------------------------------------------------------


def test_cancelling_a_queued_job_ends_it_at_once(lifecycle, store, audit, workers):
    job = _submit(store)
    lifecycle.cancel_requested(job, actor="spiffe://cantata/tenant/acme", peer="ipv4:127.0.0.1:1")
    _ended(store, job.id, pb.CANCELLED, "cancelled by tenant")
    assert workers.terminated == []
    assert [(r["actor"], r["action"], r.get("peer", "")) for r in audit.records] == [
        ("spiffe://cantata/tenant/acme", Action.JOB_CANCEL_REQUESTED, "ipv4:127.0.0.1:1"),
        ("server", Action.JOB_CANCELLED, ""),
    ]
    assert audit.of(job.id)[-1] == (Action.JOB_CANCELLED, {"reason": "cancelled by tenant"})


def test_cancelling_a_running_job_waits_for_its_workers(lifecycle, store, audit, workers):
    job = _started(lifecycle, store, workers, _submit(store))
    lifecycle.cancel_requested(job, actor="spiffe://cantata/tenant/acme", peer="")
    assert store.job(job.id).state == pb.CANCELLING and workers.terminated == [job.id]
    _exit(lifecycle, workers, job, 0, -15)  # SIGTERM while cancelling is no failure
    assert store.job(job.id).state == pb.CANCELLING and workers.scrubbed == []
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.CANCELLED, "cancelled by tenant")
    assert audit.of(job.id) == [
        (Action.JOB_STARTED, {"workers": 2}),
        (Action.JOB_CANCEL_REQUESTED, {}),
        (Action.JOB_CANCELLED, {"reason": "cancelled by tenant"}),
    ]


def test_cancelling_a_started_job_without_processes_ends_it_at_once(lifecycle, store, audit):
    job = _submit(store)
    assert lifecycle.placing(job)  # STARTING, launcher not reached yet
    lifecycle.cancel_requested(store.job(job.id), actor="spiffe://cantata/tenant/acme", peer="")
    _ended(store, job.id, pb.CANCELLED, "cancelled by tenant")
    assert audit.of(job.id)[-1] == (Action.JOB_CANCELLED, {"reason": "cancelled by tenant"})


def test_cancelling_a_finished_job_changes_and_records_nothing(lifecycle, store, audit, workers):
    job = _started(lifecycle, store, workers, _submit(store))
    _all_exit(lifecycle, workers, job)
    before = len(audit.records)
    lifecycle.cancel_requested(store.job(job.id), actor="spiffe://cantata/tenant/acme", peer="")
    assert len(audit.records) == before
    _ended(store, job.id, pb.FAILED, "workers exited without finishing")


def test_a_suspended_tenants_jobs_are_cancelled(lifecycle, store, audit, workers):
    queued, running, done = _submit(store), _submit(store), _submit(store)
    _started(lifecycle, store, workers, running)
    _started(lifecycle, store, workers, done)
    _all_exit(lifecycle, workers, done)
    lifecycle.tenant_suspended(TENANT)
    _ended(store, queued.id, pb.CANCELLED, "tenant suspended")
    assert store.job(running.id).state == pb.CANCELLING and workers.terminated == [running.id]
    _all_exit(lifecycle, workers, running)
    _ended(store, running.id, pb.CANCELLED, "tenant suspended")
    _ended(store, done.id, pb.FAILED, "workers exited without finishing")
    assert Action.JOB_CANCEL_REQUESTED not in [r["action"] for r in audit.records]  # the admin's act is audited apart
    assert audit.of(queued.id) == [(Action.JOB_CANCELLED, {"reason": "tenant suspended"})]
    assert audit.of(running.id)[-1] == (Action.JOB_CANCELLED, {"reason": "tenant suspended"})


# ---- the server stops and restarts ------------------------------------------------


def _server(lifecycle: JobLifecycle, event: str) -> None:
    """The server stops (requeueing), or restarts having adopted no job's workers."""
    if event == "server_stopping":
        lifecycle.server_stopping()
    else:
        lifecycle.server_restarted({})


def test_a_restarted_server_keeps_the_jobs_whose_workers_it_adopted(lifecycle, store, audit, workers):
    running, cancelling, unrecorded = _submit(store), _submit(store), _submit(store)
    _started(lifecycle, store, workers, running)
    _started(lifecycle, store, workers, cancelling)
    lifecycle.cancel_requested(store.job(cancelling.id), actor="spiffe://cantata/tenant/acme", peer="")
    assert lifecycle.placing(unrecorded)  # started, but the server went before it recorded the workers
    workers.terminated.clear()
    records = len(audit.records)
    lifecycle.server_restarted({running.id: 1, cancelling.id: 1})
    assert store.job(running.id).state == pb.RUNNING and store.job(running.id).attempts == 1
    assert store.job(cancelling.id).state == pb.CANCELLING and workers.terminated == [cancelling.id]
    assert store.job(unrecorded.id).state == pb.QUEUED
    assert audit.records[records:] == []  # nothing ended, nothing restarted
    last = store.events_after(running.id, 0)[-1]
    assert (last.kind, last.message) == (jobs_pb2.MESSAGE, "server restarted; re-adopted 1 running worker process")
    assert (store.workers(running.id)[0].pid, store.workers(running.id)[0].started_at) == (1000, 500)


@pytest.mark.parametrize(
    ("event", "why"), [("server_stopping", "server stopped"), ("server_restarted", "server restarted")]
)
def test_the_server_going_away_requeues_active_jobs_and_ends_cancelling_ones(
    lifecycle, store, audit, workers, event, why
):
    running, cancelling, queued = _submit(store), _submit(store), _submit(store)
    _started(lifecycle, store, workers, running)
    _started(lifecycle, store, workers, cancelling)
    lifecycle.cancel_requested(store.job(cancelling.id), actor="spiffe://cantata/tenant/acme", peer="")
    records = len(audit.records)
    _server(lifecycle, event)
    job = store.job(running.id)
    assert (job.state, job.reason) == (pb.QUEUED, f"{why}; will resume from the last checkpoint")
    _ended(store, cancelling.id, pb.CANCELLED, "cancelled by tenant")
    assert store.job(queued.id).state == pb.QUEUED and store.job(queued.id).attempts == 0
    assert audit.records[records:] == [  # the requeue is no record; the end of the cancelled job is one
        {
            "actor": "server",
            "action": Action.JOB_CANCELLED,
            "resource": cancelling.id,
            "tenant": TENANT,
            "details": {"reason": "cancelled by tenant"},
        },
    ]
    assert lifecycle.placing(store.job(running.id))  # and the requeued job starts its next attempt
    assert store.job(running.id).attempts == 2


@pytest.mark.parametrize("max_failures", [0, 1])
def test_server_restarts_are_no_failures_however_many(lifecycle, store, audit, workers, max_failures):
    job = _submit(store, max_failures=max_failures)
    for attempt in range(1, INTERRUPTIONS + 1):
        _started(lifecycle, store, workers, store.job(job.id))
        _server(lifecycle, "server_stopping" if attempt % 2 else "server_restarted")
        workers.running.pop(job.id)
        assert store.job(job.id).state == pb.QUEUED and lifecycle.due(store.job(job.id))
    job = _started(lifecycle, store, workers, store.job(job.id))
    assert (job.attempts, job.failures) == (INTERRUPTIONS + 1, 0)  # attempts inform; they do not end a job
    for i in (0, 1):
        lifecycle.worker_finished(store.job(job.id), i, final_val_loss=1.0)
    _all_exit(lifecycle, workers, job)
    _ended(store, job.id, pb.SUCCEEDED, "")
    assert [a for a, _ in audit.of(job.id)] == [Action.JOB_STARTED] * (INTERRUPTIONS + 1) + [Action.JOB_FINISHED]


# ---- every path to a terminal state leaves exactly one terminal record ------------

CANCEL = {"actor": "spiffe://cantata/tenant/acme", "peer": ""}


def _finish_all(lc: JobLifecycle, store: Store, workers: FakeWorkers, job: JobRecord) -> None:
    for w in store.workers(job.id):
        lc.worker_finished(store.job(job.id), w.idx, final_val_loss=1.0)
    _all_exit(lc, workers, job)


def _restarted_then_succeeded(lc, store, workers, clock) -> JobRecord:
    job = _started(lc, store, workers, _submit(store))
    _exit(lc, workers, job, 1, -9)
    _all_exit(lc, workers, job)
    clock.now += MAX_BACKOFF
    _finish_all(lc, store, workers, _started(lc, store, workers, store.job(job.id)))
    return job


def _budget_spent(lc, store, workers, clock) -> JobRecord:
    job = _submit(store, max_failures=1)
    _fail_repeatedly(lc, store, workers, clock, job, 2)
    return job


def _permanent(lc, store, workers, clock) -> JobRecord:
    job = _started(lc, store, workers, _submit(store))
    lc.worker_failed(job, 0, "TextEncodingError: not UTF-8", permanent=True)
    _exit(lc, workers, job, 0, 1)
    return job


def _below_quorum(lc, store, workers, clock) -> JobRecord:
    job = _decentralized(lc, store, workers, max_failures=0)
    _exit(lc, workers, job, 0, 1)
    _exit(lc, workers, job, 1, 1)
    return job


def _launch_failed(lc, store, workers, clock) -> JobRecord:
    job = _submit(store)
    assert lc.placing(job)
    lc.launch_failed(job, OSError("no such file"))
    return job


def _cancelled_while_waiting_to_restart(lc, store, workers, clock) -> JobRecord:
    job = _started(lc, store, workers, _submit(store))
    _exit(lc, workers, job, 0, 1)
    lc.cancel_requested(store.job(job.id), **CANCEL)
    return job


def _cancelling_when_the_server(event: str):
    def path(lc, store, workers, clock) -> JobRecord:
        job = _started(lc, store, workers, _submit(store))
        lc.cancel_requested(store.job(job.id), **CANCEL)
        _server(lc, event)
        return job

    return path


def _suspended(lc, store, workers, clock) -> JobRecord:
    job = _started(lc, store, workers, _submit(store))
    lc.tenant_suspended(TENANT)
    _all_exit(lc, workers, job)
    return job


PATHS = {  # path -> (drive a job to its end, the terminal state)
    "its workers finish": (
        lambda lc, s, w, c: _finish_all(lc, s, w, j := _started(lc, s, w, _submit(s))) or j,
        pb.SUCCEEDED,
    ),
    "restarted after a failure, then finishes": (_restarted_then_succeeded, pb.SUCCEEDED),
    "workers exit without finishing": (
        lambda lc, s, w, c: _all_exit(lc, w, j := _started(lc, s, w, _submit(s))) or j,
        pb.FAILED,
    ),
    "a worker fails, max_failures=0": (
        lambda lc, s, w, c: _exit(lc, w, j := _started(lc, s, w, _submit(s, max_failures=0)), 0, 1) or j,
        pb.FAILED,
    ),
    "its budget of failures is spent": (_budget_spent, pb.FAILED),
    "a worker fails for good": (_permanent, pb.FAILED),
    "a decentralized job loses its quorum": (_below_quorum, pb.FAILED),
    "its workers cannot be started": (_launch_failed, pb.FAILED),
    "cancelled while queued": (lambda lc, s, w, c: lc.cancel_requested(j := _submit(s), **CANCEL) or j, pb.CANCELLED),
    "cancelled while running": (
        lambda lc, s, w, c: (
            lc.cancel_requested(j := _started(lc, s, w, _submit(s)), **CANCEL) or _all_exit(lc, w, j) or j
        ),
        pb.CANCELLED,
    ),
    "cancelled while waiting to restart": (_cancelled_while_waiting_to_restart, pb.CANCELLED),
    "its tenant is suspended": (_suspended, pb.CANCELLED),
    "cancelling when the server stops": (_cancelling_when_the_server("server_stopping"), pb.CANCELLED),
    "cancelling when the server restarts": (_cancelling_when_the_server("server_restarted"), pb.CANCELLED),
}


@pytest.mark.parametrize("path", PATHS)
def test_every_terminal_path_leaves_one_terminal_record(lifecycle, store, audit, workers, clock, path):
    drive, state = PATHS[path]
    job = drive(lifecycle, store, workers, clock)
    assert store.job(job.id).state == state
    lifecycle.workers_exited(job.id)  # whatever arrives after the end adds nothing
    lifecycle.server_restarted({})
    lifecycle.cancel_requested(store.job(job.id), **CANCEL)
    _ended(store, job.id, state, store.job(job.id).reason)
    terminal = [(a, d) for a, d in audit.of(job.id) if a in (Action.JOB_FINISHED, Action.JOB_CANCELLED)]
    if state == pb.CANCELLED:
        assert terminal == [(Action.JOB_CANCELLED, {"reason": store.job(job.id).reason})]
    else:
        assert terminal == [
            (Action.JOB_FINISHED, {"state": pb.JobState.Name(state), "reason": store.job(job.id).reason})
        ]


def test_a_workers_numbered_report_is_applied_once_and_numbering_restarts_with_the_worker(lifecycle, store, workers):
    job = _submit(store)
    assert store.claim_report(job.id, 0, 1) is None  # not recorded yet: the worker sends it again
    _started(lifecycle, store, workers, job)
    assert [store.claim_report(job.id, 0, seq) for seq in (1, 2, 2, 1, 3)] == [True, True, False, False, True]
    assert store.claim_report(job.id, 1, 1) is True  # each worker numbers its own
    store.restart_worker(job.id, 0)
    assert store.claim_report(job.id, 0, 1) is True  # a new process counts from 1 again


@dataclass
class DiskFillingWorkers(FakeWorkers):
    """Workers whose disk fills as the lifecycle reads a log (after the exit's first write, before the restart
    is recorded: ``fill_at="log"``) or relaunches one (after the restart is recorded: ``fill_at="relaunch"``)."""

    disk: Path | None = None
    fill_at: str = "log"
    filler: Path | None = None

    def _fill(self, at: str) -> None:
        if self.disk is not None and self.filler is None and at == self.fill_at:
            self.filler = fill(self.disk)

    def log_tail(self, job_id: str, worker: int) -> str:
        self._fill("log")
        return super().log_tail(job_id, worker)

    def relaunch(self, job: JobRecord, worker: int) -> int:
        pid = super().relaunch(job, worker)
        self._fill("relaunch")
        return pid


@pytest.mark.parametrize("fill_at", ["log", "relaunch"])
def test_a_restart_the_full_disk_did_not_record_starts_one_worker_however_often_the_exit_is_handled(
    tmp_path, audit, clock, fill_at
):
    """A decentralized worker's restart is recorded before it is relaunched: while that write fails, no process
    is started; once it is relaunched, an exit handled again (the scheduler does, at its next tick, while a
    write fails) only records its process and event. Either way exactly one worker is started."""
    with small_tmpfs(tmp_path / "data") as disk:
        store = Store(disk / "state.db")
        store.add_tenancy_request(TENANT, b"csr", "sha256:x")
        store.approve_tenant(TENANT, "sha256:x", b"cert", pb.Quota(), "root")
        workers = DiskFillingWorkers(fill_at=fill_at)
        lc = JobLifecycle(
            store, audit, workers, restarts=RestartPolicy(MAX_RESTARTS, BACKOFF, MAX_BACKOFF), clock=clock
        )
        job = _decentralized(lc, store, workers)
        workers.disk = disk
        workers.running[job.id] -= 1
        for _ in range(3):  # three ticks with the disk full
            with pytest.raises(DatabaseUnavailable):
                lc.worker_exited(job.id, 2, 9)
        assert workers.filler is not None
        assert workers.relaunched == ([] if fill_at == "log" else [(job.id, 2)])
        workers.filler.unlink()
        lc.worker_exited(job.id, 2, 9)
        assert workers.relaunched == [(job.id, 2)]
        assert (store.workers(job.id)[2].restarts, store.workers(job.id)[2].pid) == (1, 2002)
        assert _messages(store, job.id) == [f"worker 2 exited with code 9: no output; restarting it (1/{MAX_RESTARTS})"]
        store.close()
