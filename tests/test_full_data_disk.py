"""A real server whose data directory (database, audit log, job logs) fills up while a real job trains.

Tenant and admin calls are refused as UNAVAILABLE naming the full disk (the SDK raises ``Unavailable``, which
it retries), the worker keeps its progress and sends its refused reports again, and once there is space the same
job goes on where it was and SUCCEEDS in its first attempt: no restart from step 0, no failure spent. A job whose
workers all died while the disk was full is not shown as running.
"""

from __future__ import annotations

import os
import re
import signal
from contextlib import ExitStack

import pytest

from cantata.sdk import Job
from cantata.sdk.errors import Unavailable
from cantata.security.audit import Action, read_records
from testkit.platform import Platform
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.fullfs import fill, small_tmpfs
from tests.test_jobs import _pids_of

pytestmark = pytest.mark.integration

STEPS = 400  # long enough that the disk fills while it trains
DATABASE_FULL = "the control-plane database cannot be written: database or disk is full (SQLITE_FULL)"
DISK_FULL = re.compile(re.escape(DATABASE_FULL) + "|the audit log cannot be written: No space left on device")
REPORT_ANSWER = re.compile(r"Worker/Report \S+ ([A-Z_]+) ")  # the access log's line of each report


@pytest.fixture
def platform(tmp_path, request):
    """A server whose data directory is a 64 MiB tmpfs; with ``audit_apart``, its audit log has a disk of its own."""
    platform = Platform(tmp_path)
    with ExitStack() as mounts:
        mounts.enter_context(small_tmpfs(platform.data_dir, size="64m"))
        if getattr(request, "param", False):
            mounts.enter_context(small_tmpfs(platform.paths.audit, size="16m"))
        platform.start()
        try:
            yield platform
        finally:
            if platform.proc is not None:
                platform.stop()
            platform.kill_workers()


def _job(platform: Platform, name: str) -> Job:
    # The checkpoints go to a store off the full disk: this test is about the control plane's disk.
    store = platform.tenant_dir("acme", "checkpoints", name).as_uri()
    return Job(
        name=name,
        model="gpt-tiny",
        steps=STEPS,
        eval_every=100,
        checkpoint_every=25,
        batch_size=4,
        seq_len=16,
        checkpoint_store=store,
    )


def _refused_reports(platform: Platform) -> list[str]:
    """The codes of the workers' reports the server did not take, in order."""
    return [code for code in REPORT_ANSWER.findall(platform.server_log()) if code != "OK"]


@pytest.mark.parametrize("platform", [False, True], ids=["audit-on-the-data-disk", "audit-apart"], indirect=True)
def test_a_full_data_disk_refuses_calls_as_unavailable_and_the_job_goes_on_once_there_is_space(platform, request):
    audit_apart = request.node.callspec.params["platform"]
    tenant = platform.enroll("acme", max_concurrent_jobs=1000)
    admin = platform.admin()
    handle = tenant.submit(_job(platform, "through-a-full-disk"))
    wait_for(lambda: tenant.get(handle.id).step > 0, timeout=JOB_TIMEOUT_S)
    refused_before = len(_refused_reports(platform))

    filler = fill(platform.data_dir)
    # The worker's reports are refused as UNAVAILABLE (which it sends again instead of dying), not UNKNOWN.
    assert set(wait_for(lambda: _refused_reports(platform)[refused_before:])) == {"UNAVAILABLE"}
    accepted = []  # submits may take what room the files' last pages still have, then one is refused
    for call in (
        lambda: [accepted.append(tenant.submit(Job(name=f"full-{i}", model="gpt-tiny", steps=10))) for i in range(900)],
        lambda: tenant.cancel(handle.id),
        lambda: admin.set_quota("acme", max_concurrent_jobs=999),
    ):
        with pytest.raises(Unavailable) as refused:
            call()
        assert DISK_FULL.search(str(refused.value)), str(refused.value)
        if audit_apart:  # the audit log has room: the database is what refuses
            assert DATABASE_FULL in str(refused.value), str(refused.value)
    shown = tenant.get(handle.id)
    assert shown.state == "RUNNING" and _pids_of(handle.id)  # its worker lives on, and it is shown so

    filler.unlink()
    for queued in accepted:
        queued.cancel()
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    progress = [e.step for e in events if e.kind == "PROGRESS"]
    assert progress == list(range(STEPS // 100, STEPS + 1, STEPS // 100))  # every report once, in order, from 0
    assert [e.step for e in events if e.kind == "CHECKPOINT"] == list(range(25, STEPS + 1, 25))
    messages = [e.message for e in events]
    assert not [m for m in messages if "restarting" in m or "will resume" in m or "no heartbeat" in m], messages
    actions = [r.action for r in read_records(platform.data_dir / "audit") if r.resource == handle.id]
    assert actions.count(Action.JOB_STARTED) == 1 and Action.JOB_RESTARTED not in actions
    assert tenant.get(handle.id).state == "SUCCEEDED"
    admin.close()
    tenant.close()


def test_a_job_whose_workers_died_while_the_disk_was_full_is_not_shown_running(platform):
    tenant = platform.enroll("acme", max_concurrent_jobs=10)
    handle = tenant.submit(_job(platform, "dies-on-a-full-disk"))
    wait_for(lambda: tenant.get(handle.id).step > 0, timeout=JOB_TIMEOUT_S)
    pids = _pids_of(handle.id)
    refused_before = len(_refused_reports(platform))
    filler = fill(platform.data_dir)
    wait_for(lambda: _refused_reports(platform)[refused_before:])  # what room the files had left is taken
    for pid in pids:
        os.killpg(pid, signal.SIGKILL)

    shown = wait_for(lambda: (s := tenant.get(handle.id)).state != "RUNNING" and s, timeout=JOB_TIMEOUT_S)
    assert shown.state == "QUEUED", shown
    assert "its workers exited" in shown.reason and DISK_FULL.search(shown.reason), shown.reason
    assert [j.state for j in tenant.list() if j.id == handle.id] == ["QUEUED"]

    filler.unlink()  # now the exit is judged and recorded: a failure, restarted from its latest checkpoint
    restarted = next(e for e in handle.events() if "restarting the job from step" in e.message)
    assert "worker 0 exited with code" in restarted.message, restarted.message
    tenant.cancel(handle.id)
    assert handle.wait().state == "CANCELLED"
    tenant.close()
