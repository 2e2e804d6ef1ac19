"""An ended job resumed under its id, and a hung worker caught by its heartbeat: real server, real workers.

The module's server kills a worker silent for ``HEARTBEAT_TIMEOUT_S``, so every
job here also shows that healthy workers keep beating through start-up,
training and checkpoints.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records
from testkit.platform import Platform, cli
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import QUICK

HEARTBEAT_TIMEOUT_S = 3.0
LONG = dict(model="gpt-tiny", steps=100_000, eval_every=50_000, checkpoint_every=50_000, batch_size=4, seq_len=16)
RESUMABLE = dict(model="gpt-tiny", steps=400, eval_every=200, checkpoint_every=25, batch_size=4, seq_len=16)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"))
    settings = p.paths.load_settings()
    settings.worker_heartbeat_timeout_s = HEARTBEAT_TIMEOUT_S
    p.paths.save_settings(settings)
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


def _cancelled(client, **spec) -> str:
    handle = client.submit(Job(name="to-resume", **(spec or LONG)))
    handle.cancel()
    assert handle.wait().state == "CANCELLED"
    return handle.id


def _resumed_records(platform: Platform, job_id: str) -> list:
    return [
        r for r in read_records(platform.data_dir / "audit") if r.action == Action.JOB_RESUMED and r.resource == job_id
    ]


def test_a_cancelled_job_resumes_from_its_checkpoint_to_success_under_its_id(platform, tenant):
    handle = tenant.submit(Job(name="resumed", **RESUMABLE))
    wait_for(lambda: any(c.step >= 25 for c in tenant.checkpoints(handle.id)), timeout=JOB_TIMEOUT_S)
    handle.cancel()
    assert handle.wait().state == "CANCELLED"
    ended = list(handle.events())
    latest = max(c.step for c in tenant.checkpoints(handle.id))
    assert ended[-1].terminal and ended[-1].state == "CANCELLED"

    resumed = tenant.resume(handle.id)
    assert resumed.id == handle.id and resumed.status().state in ("QUEUED", "STARTING", "RUNNING")
    status = resumed.wait()  # from cursor 0: through the earlier end, to the new one
    assert status.state == "SUCCEEDED", status.reason
    assert status.step == RESUMABLE["steps"]

    events = list(handle.events())
    assert [(e.seq, e.kind, e.state) for e in events[: len(ended)]] == [(e.seq, e.kind, e.state) for e in ended]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[len(ended) - 1].state == "CANCELLED" and not events[len(ended) - 1].terminal  # history, not the end
    assert [e.terminal for e in events].count(True) == 1 and events[-1].state == "SUCCEEDED"
    again = events[len(ended)]
    assert (again.kind, again.state, again.message) == ("STATE", "QUEUED", "resumed by tenant")

    # a watcher of the old stream reconnects from its cursor: the new events, to the new end
    after = list(tenant.events(handle.id, cursor=ended[-1].seq))
    assert after[0] == again and after[-1].terminal and after[-1].state == "SUCCEEDED"
    resumed_at = [
        int(m.group(1)) for e in after if (m := re.match(r"resumed from checkpoint at step (\d+)", e.message))
    ]
    assert resumed_at == [latest] and latest >= 25  # from its latest checkpoint, not from step 0
    assert [c.step for c in tenant.checkpoints(handle.id)][-1] == RESUMABLE["steps"]

    (record,) = _resumed_records(platform, handle.id)
    details = dict(record.details)
    assert re.fullmatch(r"[0-9a-f]{32}", details.pop("request_id"))  # the resume call's request id
    assert (record.actor, record.tenant, details) == (
        "spiffe://cantata/tenant/acme",
        "acme",
        {"from": "CANCELLED"},
    )


def test_resuming_another_tenants_job_is_not_found(platform, tenant):
    job_id = _cancelled(tenant)
    with platform.enroll("rival") as rival:
        with pytest.raises(errors.NotFound) as theirs:
            rival.resume(job_id)
        with pytest.raises(errors.NotFound) as missing:
            rival.resume("job-0000000000000000")
    assert f"job {job_id!r} not found" in str(theirs.value)  # word for word what a missing id gets
    assert "job 'job-0000000000000000' not found" in str(missing.value)
    assert tenant.get(job_id).state == "CANCELLED"
    assert not _resumed_records(platform, job_id)


def test_a_succeeded_or_running_job_is_not_resumed(platform, tenant):
    done = tenant.submit(Job(name="done", **QUICK))
    assert done.wait().state == "SUCCEEDED"
    with pytest.raises(errors.Conflict, match="SUCCEEDED and cannot be resumed") as refused:
        done.resume()
    assert refused.value.code.name == "FAILED_PRECONDITION"
    running = tenant.submit(Job(name="running", **LONG))
    wait_for(lambda: running.status().state == "RUNNING", timeout=JOB_TIMEOUT_S)
    with pytest.raises(errors.Conflict, match="RUNNING and cannot be resumed"):
        running.resume()
    running.cancel()
    assert running.wait().state == "CANCELLED"
    assert done.status().state == "SUCCEEDED"
    assert not _resumed_records(platform, done.id) and not _resumed_records(platform, running.id)


def test_resume_is_held_to_the_concurrent_jobs_quota(platform, tenant):
    with platform.enroll("one-at-a-time", max_concurrent_jobs=1) as client:
        job_id = _cancelled(client)
        busy = client.submit(Job(name="busy", **LONG))
        with pytest.raises(errors.QuotaExceeded) as refused:
            client.resume(job_id)
        assert (refused.value.what, refused.value.limit, refused.value.used) == ("concurrent jobs", 1, 1)
        assert client.get(job_id).state == "CANCELLED"
        busy.cancel()
        assert busy.wait().state == "CANCELLED"
        env = {**platform.env}
        result = cli("jobs", "resume", job_id, "--profile", "one-at-a-time", "--json", env=env)
        assert '"state": "' in result.stdout and client.get(job_id).state != "CANCELLED"
        client.cancel(job_id)
        assert client.job(job_id).wait().state == "CANCELLED"


def _worker_pid(job_id: str, worker: int) -> int | None:
    """The pid of process ``worker`` of the job (its config file names it)."""
    needle = f"worker-{worker}.json".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"cantata.trainer.worker" in cmdline and job_id.encode() in cmdline and needle in cmdline:
                    return int(entry.name)
    return None


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] in ("Z", "X")
    except OSError:
        return True


# Below gloo's 5-minute timeout, which was all that ended such a job before.
@pytest.mark.timeout(240)
def test_a_stopped_worker_of_an_allreduce_job_is_caught_by_its_heartbeat_and_killed(platform, tenant):
    spec = {**LONG, "steps": 5000}  # progress every 50 steps
    handle = tenant.submit(Job(name="frozen", algorithm="allreduce", workers=2, **spec))
    events = handle.events()
    next(e for e in events if e.kind == "PROGRESS")  # both workers train, in lockstep
    pids = [_worker_pid(handle.id, 0), _worker_pid(handle.id, 1)]
    assert None not in pids
    frozen = pids[1]
    try:
        os.kill(frozen, signal.SIGSTOP)
        caught = next(e for e in events if "sent no heartbeat" in e.message)
        match = re.fullmatch(r"worker 1 sent no heartbeat for ([\d.]+) s; killed", caught.message)
        assert match and caught.worker == 1 and float(match.group(1)) >= HEARTBEAT_TIMEOUT_S
        # it was killed, and its exit took the path of any dead worker's: the group it froze is gone
        wait_for(lambda: all(_gone(pid) for pid in pids))
    finally:
        if not _gone(frozen):
            os.kill(frozen, signal.SIGKILL)
    if not handle.status().terminal:
        handle.cancel()
    assert handle.wait().terminal
