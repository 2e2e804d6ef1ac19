"""The control plane restarts without stopping training: real server, real workers, killed and stopped for real.

A job's worker keeps training while its server is down (its log shows new
steps), buffers what it reports, and the restarted server re-adopts it by pid
and start time: the job ends SUCCEEDED in its first attempt, with every
progress, checkpoint and eval event exactly once and the event numbers
gapless. A worker that dies while the server is down takes the failure path.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records, verify
from cantata.server.workers.launcher import AdoptedProcess
from cantata.server.workers.process_identity import running, start_time
from cantata.server.workers.zygote import ZYGOTE_GONE, ZYGOTE_MODULE
from testkit.platform import Platform
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.test_jobs import _pids_of

STEPS = 400  # long enough that a fast machine is still training when the test acts
JOB = dict(model="gpt-tiny", steps=STEPS, eval_every=100, checkpoint_every=25, batch_size=4, seq_len=16)
STEP_LINE = re.compile(rb"step (\d+)/\d+ loss")


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("restarts"))
    p.start()
    yield p
    if p.proc is not None:
        p.stop()
    p.kill_workers()  # what a test that failed while its server was down left running


def _logged_step(platform: Platform, job_id: str) -> int:
    """The latest step worker 0's log shows (the log is written by the worker itself, server or not)."""
    try:
        text = (platform.data_dir / "jobs" / job_id / "worker-0.log").read_bytes()
    except FileNotFoundError:  # not started yet
        return 0
    return max((int(m.group(1)) for m in STEP_LINE.finditer(text)), default=0)


def _audited(platform: Platform, job_id: str) -> list[str]:
    return [r.action for r in read_records(platform.data_dir / "audit") if r.resource == job_id]


def _assert_ran_once_through(handle, platform: Platform) -> None:
    """SUCCEEDED in its first attempt, every report applied exactly once, events numbered without a gap."""
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    progress = [e.step for e in events if e.kind == "PROGRESS"]
    assert progress == list(range(STEPS // 100, STEPS + 1, STEPS // 100))  # each report once, in order
    assert [e.step for e in events if e.kind == "CHECKPOINT"] == list(range(25, STEPS + 1, 25))
    assert [e.step for e in events if e.kind == "EVAL"] == list(range(100, STEPS + 1, 100))
    messages = [e.message for e in events]
    assert "server restarted; re-adopted 1 running worker process" in messages
    restarts = [m for m in messages if "restarting the job" in m or "will resume" in m or "no heartbeat" in m]
    assert not restarts, restarts
    actions = _audited(platform, handle.id)
    assert actions.count(Action.JOB_STARTED) == 1 and Action.JOB_RESTARTED not in actions
    log = (platform.data_dir / "jobs" / handle.id / "worker-0.log").read_text()
    assert log.count("started (attempt") == 1  # one process trained it all
    assert not _pids_of(handle.id)


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_a_job_trains_on_while_its_server_is_down_and_the_restarted_server_adopts_it(platform, tenant, how):
    handle = tenant.submit(Job(name=f"through-{how}", **JOB))
    wait_for(lambda: _logged_step(platform, handle.id) >= STEPS // 10, timeout=JOB_TIMEOUT_S)
    (pid,) = _pids_of(handle.id)
    if how == "sigkill":
        platform.kill()
    else:
        assert platform.stop(leave_workers=True) == 0  # on_stop defaults to "leave": an upgrade
        stopped = [r for r in read_records(platform.data_dir / "audit") if r.action == Action.SERVER_STOPPED][-1]
        assert stopped.details == {"jobs": "leave"}
    down_at = _logged_step(platform, handle.id)
    wait_for(
        lambda: _logged_step(platform, handle.id) > down_at + STEPS // 10, timeout=JOB_TIMEOUT_S
    )  # training, no server
    assert _pids_of(handle.id) == [pid]
    platform.start()
    _assert_ran_once_through(handle, platform)


def test_on_stop_requeue_stops_the_jobs_which_resume_from_their_checkpoints(platform, tenant):
    platform.stop()
    platform.start("--on-stop", "requeue")
    handle = tenant.submit(Job(name="requeued", **JOB))
    wait_for(lambda: any(c.step >= 25 for c in tenant.checkpoints(handle.id)), timeout=JOB_TIMEOUT_S)
    assert platform.stop() == 0
    assert not _pids_of(handle.id)
    records = list(read_records(platform.data_dir / "audit"))
    assert records[-1].action == Action.SERVER_STOPPED and records[-1].details == {"jobs": "requeue"}
    assert verify(platform.data_dir / "audit").ok
    platform.start()
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    messages = [e.message for e in handle.events()]
    assert "server stopped; will resume from the last checkpoint" in messages
    assert any(m.startswith("resumed from checkpoint at step") for m in messages)


def test_a_worker_that_died_while_the_server_was_down_takes_the_failure_path(platform, tenant):
    handle = tenant.submit(Job(name="died-meanwhile", max_failures=1, **JOB))
    wait_for(lambda: any(c.step >= 25 for c in tenant.checkpoints(handle.id)), timeout=JOB_TIMEOUT_S)
    platform.kill()
    (pid,) = _pids_of(handle.id)
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not _pids_of(handle.id), timeout=JOB_TIMEOUT_S)
    platform.start()
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    messages = [e.message for e in handle.events()]
    restarted = [m for m in messages if "restarting the job from step" in m]
    assert len(restarted) == 1 and restarted[0].startswith("worker 0 exited with code -9")
    assert "server restarted; re-adopted 0 running worker processes" in messages
    assert _audited(platform, handle.id).count(Action.JOB_RESTARTED) == 1


# A stand-in for an earlier server's zygote (its argv names the zygote's module): it forks a worker that
# sleeps, and reaps it and writes its status file only when told to on stdin, as late as a busy zygote may.
SLOW_ZYGOTE = """
import json, os, sys, time
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
print(child, flush=True)
sys.stdin.readline()
_, status = os.waitpid(child, 0)
open(sys.argv[1], "w").write(json.dumps({"pid": child, "code": -os.WTERMSIG(status)}))
sys.stdin.readline()
"""


def test_an_adopted_worker_that_exited_waits_for_its_zygote_to_say_how_rather_than_counting_as_killed(tmp_path):
    status = tmp_path / "worker-0.status"
    zygote = subprocess.Popen(
        [sys.executable, "-c", SLOW_ZYGOTE, str(status), ZYGOTE_MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert zygote.stdout is not None and zygote.stdin is not None
        pid = int(zygote.stdout.readline())
        worker = AdoptedProcess.adopt(pid, start_time(pid), status)
        assert worker.zygote == (zygote.pid, start_time(zygote.pid))
        assert worker.poll() is None  # running
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not running(pid, worker.started_at))  # a zombie: exited, its zygote has not reaped it
        assert worker.poll() is None  # not yet known, not "killed"
        zygote.stdin.write("reap\n")
        zygote.stdin.flush()
        wait_for(lambda: status.exists() and status.read_text())
        assert worker.poll() == -signal.SIGTERM
    finally:
        zygote.kill()
        zygote.wait()


def test_an_adopted_worker_gone_with_no_status_and_no_zygote_counts_as_killed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    worker = AdoptedProcess.adopt(child.pid, start_time(child.pid), tmp_path / "worker-0.status")
    assert worker.zygote is None  # its parent is this test, not a zygote
    child.kill()
    child.wait()
    assert worker.poll() == ZYGOTE_GONE


def test_a_pid_is_the_same_process_only_with_its_start_time():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = start_time(child.pid)
        assert started > 0 and running(child.pid, started)
        assert not running(child.pid, started + 1)  # a process that reused the pid started at another time
        assert start_time(os.getpid()) != started
    finally:
        child.kill()
        child.wait()
    assert not running(child.pid, started)
