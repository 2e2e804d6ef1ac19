"""The server itself stopped or killed mid-job: no job stays RUNNING, history survives."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records, verify
from tests.test_jobs import _pids_of
from tests.waiting import wait_for

JOB = dict(model="gpt-tiny", steps=1500, eval_every=500, checkpoint_every=20, batch_size=4, seq_len=16)


def test_sigkill_mid_job_then_restart_resumes_from_the_checkpoint(platform, tenant):
    handle = tenant.submit(Job(name="survivor", **JOB))
    wait_for(lambda: any(c.step >= 20 for c in tenant.checkpoints(handle.id)))
    before = _events_until_now(tenant, handle.id)
    platform.kill()
    wait_for(lambda: not _pids_of(handle.id))  # orphaned workers stop on their own
    platform.start()
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    after = list(handle.events())
    assert [(e.seq, e.kind, e.step) for e in after[: len(before)]] == [(e.seq, e.kind, e.step) for e in before]
    messages = [e.message for e in after]
    assert any("server restarted" in m for m in messages)
    resumed = [m for m in messages if m.startswith("resumed from checkpoint at step")]
    assert resumed and int(resumed[0].rsplit(" ", 1)[1]) >= 20


def _events_until_now(tenant, job_id):
    """Events recorded so far, without waiting for the job to end."""
    from cantata.proto.v1 import jobs_pb2

    events = []
    stream = tenant._jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id=job_id), timeout=2)
    try:
        events.extend(stream)  # keeps what arrived before the deadline
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    from cantata.sdk.client import Event

    return [Event.from_proto(e) for e in events]


def test_sigterm_stops_gracefully_and_requeues_running_jobs(platform, tenant):
    handle = tenant.submit(Job(name="graceful", **JOB))
    wait_for(lambda: handle.status().state == "RUNNING")
    assert platform.stop() == 0
    assert not _pids_of(handle.id)
    records = list(read_records(platform.data_dir / "audit"))
    assert records[-1].action == Action.SERVER_STOPPED and verify(platform.data_dir / "audit").ok
    platform.start()
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    assert any("server stopped" in e.message for e in handle.events())


def test_health_service_reports_serving(platform):
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
