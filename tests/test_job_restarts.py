"""Jobs survive worker failures within their ``max_failures`` budget, and server restarts are no failures.

Real server, real worker processes: a worker SIGKILLed mid-job restarts its
job's worker group from the latest checkpoint; a job past its budget fails and
says so; a job whose server is SIGKILLed and restarted again and again
trains on in its one worker process, even with a budget of 0.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

import pytest

from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records
from cantata.storage.base import StoreConfigError, StoreUnavailableError
from cantata.trainer.data.errors import DatasetAccessError, DatasetUnavailableError, TextEncodingError
from cantata.trainer.worker import permanent
from testkit.platform import Platform, readable
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_decentralized_jobs import _worker_of
from tests.test_jobs import _pids_of

SMALL = dict(model="gpt-tiny", batch_size=4, seq_len=16, checkpoint_every=10, eval_every=1000)
ENDLESS = 100_000  # steps of a job that ends only by what the test does to it


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    settings = p.paths.load_settings()
    settings.restart_backoff_seconds, settings.restart_backoff_max_seconds = 0.2, 0.5
    p.paths.save_settings(settings)
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


def _running_workers(handle, n: int, besides: frozenset[int] = frozenset()) -> dict[int, int]:
    """Until ``n`` workers of the job run (none of pids ``besides``) and it is RUNNING; worker index -> pid."""

    def ready() -> dict[int, int] | None:
        pids = set(_pids_of(handle.id))
        if len(pids) != n or pids & besides or handle.status().state != "RUNNING":
            return None
        return {_worker_of(pid): pid for pid in pids}

    return wait_for(ready)


def _latest_checkpoint(tenant, job_id: str) -> int:
    return max((c.step for c in tenant.checkpoints(job_id)), default=0)


def _restarts(platform: Platform, job_id: str) -> list[Mapping[str, object]]:
    return [
        r.details
        for r in read_records(platform.data_dir / "audit")
        if r.action == Action.JOB_RESTARTED and r.resource == job_id
    ]


def test_a_killed_allreduce_worker_restarts_the_job_from_its_checkpoint(platform, tenant):
    steps = 100
    handle = tenant.submit(Job(name="restarts", algorithm="allreduce", workers=2, steps=steps, **SMALL))
    workers = _running_workers(handle, 2)
    killed_after = wait_for(lambda: _latest_checkpoint(tenant, handle.id), timeout=JOB_TIMEOUT_S)
    os.kill(workers[1], signal.SIGKILL)
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    messages = [e.message for e in handle.events()]
    restart = next(m for m in messages if "restarting the job from step" in m)
    assert restart.startswith("worker 1 exited with code -9: ") and restart.endswith("(attempt 1/3)")
    from_step = int(restart.split("restarting the job from step ")[1].split(" ")[0])
    assert from_step >= killed_after
    assert f"resumed from checkpoint at step {from_step}" in messages  # the new workers started where it said
    assert _latest_checkpoint(tenant, handle.id) == steps > from_step
    assert _restarts(platform, handle.id) == [
        {"failures": 1, "max_failures": 3, "from_step": from_step, "reason": restart.split("; restarting")[0]}
    ]


def test_a_job_with_max_failures_0_fails_at_the_first_kill(platform, tenant):
    handle = tenant.submit(Job(name="fragile", steps=ENDLESS, max_failures=0, **SMALL))
    os.kill(_running_workers(handle, 1)[0], signal.SIGKILL)
    status = handle.wait()
    assert status.state == "FAILED"
    assert status.reason.startswith("worker 0 exited with code -9: ")
    assert status.reason.endswith("; gave up after 1 failure (max_failures=0)")
    assert _restarts(platform, handle.id) == []


def test_a_job_killed_more_than_max_failures_times_gives_up(platform, tenant):
    handle = tenant.submit(Job(name="doomed", steps=ENDLESS, max_failures=1, **SMALL))
    first = _running_workers(handle, 1)[0]
    os.kill(first, signal.SIGKILL)
    os.kill(_running_workers(handle, 1, besides=frozenset({first}))[0], signal.SIGKILL)  # its restart
    status = handle.wait()
    assert status.state == "FAILED"
    assert status.reason.endswith("; gave up after 2 failures (max_failures=1)"), status.reason
    assert [d["failures"] for d in _restarts(platform, handle.id)] == [1]


def test_a_bad_dataset_fails_the_job_at_once(platform, tenant):
    data = platform.tenant_dir("acme", "too-short")
    (data / "a.txt").write_text("too short")
    readable(data)
    handle = tenant.submit(Job(name="bad-data", steps=20, dataset=data.as_uri(), **SMALL))
    status = handle.wait()
    assert status.state == "FAILED"
    assert "DataError" in status.reason and status.reason.endswith("; not restarted: the error is permanent")
    assert _restarts(platform, handle.id) == []


@pytest.mark.parametrize(
    ("error", "is_permanent"),
    [
        (TextEncodingError("x.txt is not UTF-8"), True),
        (DatasetAccessError("refused"), True),
        (StoreConfigError("no bucket named"), True),
        (DatasetUnavailableError("s3 kept failing"), False),
        (StoreUnavailableError("s3 timed out"), False),
        (RuntimeError("gloo: connection reset by peer"), False),
        (OSError("No space left on device"), False),
    ],
)
def test_a_failure_is_permanent_when_the_jobs_inputs_are_at_fault(error, is_permanent):
    assert permanent(error) is is_permanent


def test_server_sigkills_and_restarts_are_no_job_failures(platform, tenant):
    kills = 3  # as many as used to fail every job (max_job_attempts)
    handle = tenant.submit(Job(name="steadfast", steps=ENDLESS, max_failures=0, **SMALL))
    (pid,) = _running_workers(handle, 1).values()
    reached = 0
    for _ in range(kills):
        reached = wait_for(
            lambda r=reached: (s := _latest_checkpoint(tenant, handle.id)) > r and s, timeout=JOB_TIMEOUT_S
        )
        platform.kill()
        platform.start()
    wait_for(
        lambda r=reached: _latest_checkpoint(tenant, handle.id) > r, timeout=JOB_TIMEOUT_S
    )  # still training, still reporting
    assert _running_workers(handle, 1) == {0: pid}  # one worker process, re-adopted each time
    handle.cancel()  # reaches the adopted worker like any other
    assert handle.wait().state == "CANCELLED"
    messages = [e.message for e in handle.events()]
    assert messages.count("server restarted; re-adopted 1 running worker process") == kills
    assert not any("restarting the job" in m or "will resume" in m for m in messages)
    records = [r for r in read_records(platform.data_dir / "audit") if r.resource == handle.id]
    assert [r.action for r in records].count(Action.JOB_STARTED) == 1
    assert records[-1].action == Action.JOB_CANCELLED
