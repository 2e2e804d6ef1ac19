"""A submit's job and its audit record are synced side by side; a crash between the two leaves no unaudited job.

The server runs for real under a wrapper that, once the test arms it, plays a power cut at the worst
moment: the database's write-ahead log has been synced (the job is durable) while the audit record's
sync has not finished, so the record, written but not on disk, is lost (cut from the segment) and the
process dies. The caller was never answered; the restarted server finds the job without its record and
undoes it, and the audit log verifies. The cut is simulated because a real power cut cannot be caused here.
"""

from __future__ import annotations

import sqlite3
import sys
import textwrap
import uuid

import grpc
import pytest

from cantata.proto.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from cantata.security.audit import Action, read_records, verify
from tests.platform import Platform

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
