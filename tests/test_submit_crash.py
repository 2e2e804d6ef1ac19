"""A submit's job and its audit record are synced side by side; a crash between the two leaves no unaudited job.

The server runs for real under a wrapper that, once the test arms it, plays a power cut at the worst
moment: the database's write-ahead log has been synced (the job is durable) while the audit record's
sync has not finished, so the record, written but not on disk, is lost (cut from the segment) and the
process dies. The caller was never answered; the restarted server finds the job without its record and
undoes it, and the audit log verifies. The cut is simulated because a real power cut cannot be caused here.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import uuid

import grpc
import pytest

from cantata.proto.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from cantata.security.audit import Action, read_records, verify
from testkit.platform import Platform, cli

_POWER_CUT = textwrap.dedent("""
    import os, runpy, sys, threading
    armed, real, wal_synced = sys.argv.pop(1), os.fdatasync, threading.Event()

    def fdatasync(fd):
        if not os.path.exists(armed):
            return real(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith("-wal"):
            real(fd)
            wal_synced.set()  # the commit is durable
        elif "/segments/" in target:
            wal_synced.wait(60)
            with open(target, "rb") as f:
                data = f.read()
            os.truncate(target, data.rstrip(b"\\n").rfind(b"\\n") + 1)  # the unsynced record is lost
            os._exit(9)
        else:
            real(fd)

    os.fdatasync = fdatasync
    sys.argv = ["cantata", *sys.argv[4:]]  # after: python -m cantata.sdk.cli
    runpy.run_module("cantata.sdk.cli", run_name="__main__")
""")

SPEC = common_pb2.JobSpec(name="cut", workers=1, ranks_per_worker=1, steps=10, batch_size=4, seq_len=16)


def _jobs(platform: Platform, tenant: str) -> jobs_pb2_grpc.JobsStub:
    profile = platform.home / "profiles" / tenant
    credentials = grpc.ssl_channel_credentials(
        platform.ca_pem, (profile / "key.pem").read_bytes(), (profile / "cert.pem").read_bytes()
    )
    return jobs_pb2_grpc.JobsStub(grpc.secure_channel(platform.address, credentials))


@pytest.fixture
def platform(tmp_path):
    p = Platform(tmp_path, settings={"max_workers_on_node": 0})
    yield p
    if p.proc is not None:
        p.kill()


def test_a_crash_between_the_commit_and_the_audit_sync_leaves_no_unaudited_job(platform, tmp_path):
    wrapper, armed = tmp_path / "power_cut.py", tmp_path / "armed"
    wrapper.write_text(_POWER_CUT)
    platform.start(prefix=(sys.executable, str(wrapper), str(armed)))
    platform.enroll("acme").close()
    jobs = _jobs(platform, "acme")
    before = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex), timeout=60)

    armed.touch()
    try:
        jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex), timeout=60)
    except grpc.RpcError as cut:
        assert cut.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED)
    else:
        raise AssertionError("the submit was answered although the server died before its record was durable")
    assert platform.proc is not None and platform.proc.wait() == 9
    platform.proc = None

    # What the cut left: the job committed and durable, its record gone.
    with sqlite3.connect(platform.paths.database) as db:
        rows = db.execute("SELECT id, audit_seq FROM jobs WHERE tenant='acme' ORDER BY created_at").fetchall()
    assert [r[0] for r in rows][:1] == [before.id] and len(rows) == 2
    orphan, orphan_seq = rows[1]
    audit = platform.data_dir / "audit"
    recorded = {(r.action, r.resource) for r in read_records(audit)}
    assert (Action.JOB_SUBMITTED, before.id) in recorded and (Action.JOB_SUBMITTED, orphan) not in recorded
    assert orphan_seq > max(r.seq for r in read_records(audit))

    platform.start()  # a normal start reconciles: the unaudited job is undone, the audited one stays
    jobs = _jobs(platform, "acme")
    listed = jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=60)
    assert [j.id for j in listed.jobs] == [before.id]
    assert f"undid the submission of {orphan}" in platform.server_log()
    after = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex), timeout=60)
    platform.stop()
    resources = [r.resource for r in read_records(audit) if r.action == Action.JOB_SUBMITTED]
    assert resources == [before.id, after.id]
    assert verify(audit).ok


# What a crash after a submit's record was synced, before its commit was, leaves: the record, durable, and no job.
# This process writes such records through the audit log's own API and dies without closing the log (no final
# checkpoint), as the server would have; the job rows are simply never committed.
_RECORD_THEN_DIE = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from cantata.security.audit import Action, AuditLog

    audit, actor, *jobs = sys.argv[1:]
    log = AuditLog.open(Path(audit))
    for job in jobs:
        log.append(actor, Action.JOB_SUBMITTED, resource=job, tenant="acme", details={"name": "lost", "steps": 10})
    os._exit(9)
""")


def test_a_crash_between_the_audit_sync_and_the_commit_is_voided_once_by_a_compensating_record(platform, tmp_path):
    audit = platform.data_dir / "audit"
    platform.start()
    platform.enroll("acme", max_total_steps=100).close()
    jobs = _jobs(platform, "acme")
    kept = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex), timeout=60)
    too_long = common_pb2.JobSpec(name="long", workers=1, ranks_per_worker=1, steps=1000, batch_size=4, seq_len=16)
    with pytest.raises(grpc.RpcError):  # refused: its job_submitted record (outcome refused) names no job
        jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=too_long, request_id=uuid.uuid4().hex), timeout=60)
    platform.kill()  # no final checkpoint: the records stay after the last signed one, as after a crash
    (submitted,) = [r for r in read_records(audit) if r.action == Action.JOB_SUBMITTED and r.outcome == "ok"]
    assert submitted.resource == kept.id
    lost = [f"job-{uuid.uuid4().hex[:16]}" for _ in range(2)]
    script = tmp_path / "record_then_die.py"
    script.write_text(_RECORD_THEN_DIE)
    died = subprocess.run([sys.executable, str(script), str(audit), submitted.actor, *lost], check=False)
    assert died.returncode == 9
    orphans = {
        r.resource: r.seq for r in read_records(audit) if r.action == Action.JOB_SUBMITTED and r.resource in lost
    }
    assert sorted(orphans) == sorted(lost)

    def voided() -> list:
        return [r for r in read_records(audit) if r.action == Action.JOB_SUBMISSION_VOIDED]

    platform.start()  # start-up reconciliation: one compensating record per orphan, before the server serves
    first = voided()
    assert sorted((r.resource, r.details["submitted_seq"], r.tenant) for r in first) == sorted(
        (job, seq, "acme") for job, seq in orphans.items()
    )
    assert all(
        f"voided the job_submitted record {seq} of {job}" in platform.server_log() for job, seq in orphans.items()
    )
    listed = _jobs(platform, "acme").ListJobs(jobs_pb2.ListJobsRequest(), timeout=60)
    assert [j.id for j in listed.jobs] == [kept.id]  # the real job stays, and is not voided

    platform.kill()  # the orphans and their voiding records are still after the last checkpoint: seen again
    platform.start()
    assert voided() == first  # a second start adds nothing
    platform.stop()
    assert voided() == first
    assert verify(audit).ok
    assert cli("audit", "verify", "--data-dir", str(platform.data_dir)).returncode == 0
