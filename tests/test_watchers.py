"""A thousand open event streams hold no thread: everyone else is still answered, and each stream gets every event.

One tenant opens 1,000 ``WatchJob`` streams (its cap, from ``server.json``);
the 1,001st is refused with ``RESOURCE_EXHAUSTED``. While they are open,
another tenant's ``GetJob``, the admin's ``ListTenants`` and a worker's
``Report`` must each be answered within a 1 s deadline (a deadline, not a
timing measurement: a thread-per-stream server answers none of them). Then the
job is cancelled and every stream receives the terminal event from the
server's in-memory broadcast. The server logs JSON lines (``--log-format json``). The server places no job (no worker slots), so
no worker process costs CPU here.
"""

from __future__ import annotations

import datetime as dt
import json

import grpc
import pytest

from cantata.proto.v1 import admin_pb2, admin_pb2_grpc, common_pb2, jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from cantata.sdk import Job, errors
from cantata.security.pki import CertificateAuthority, Principal
from testkit.platform import Platform
from testkit.waiting import wait_for

WATCHERS = 1000
ANSWERED_WITHIN_S = 1.0
TINY = dict(steps=10, batch_size=4, seq_len=16, eval_every=10, checkpoint_every=10)


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("watchers"))
    settings = json.loads(platform.paths.config.read_text())
    settings.update(max_streams_per_principal=WATCHERS, max_workers_on_node=0)  # jobs stay queued
    platform.paths.config.write_text(json.dumps(settings))
    platform.start("--log-format", "json")
    yield platform
    platform.stop()


def _channel(platform: Platform, cert: bytes, key: bytes) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(platform.ca_pem, private_key=key, certificate_chain=cert)
    return grpc.secure_channel(platform.address, credentials)


def _profile_channel(platform: Platform, name: str) -> grpc.Channel:
    profile = platform.home / "profiles" / name
    return _channel(platform, (profile / "cert.pem").read_bytes(), (profile / "key.pem").read_bytes())


def test_a_thousand_watchers_leave_everyone_else_answered(crowded):
    crowd, other = crowded.enroll("crowd"), crowded.enroll("other")
    watched = crowd.submit(Job(name="watched", **TINY))
    theirs = other.submit(Job(name="theirs", **TINY))
    ca = CertificateAuthority.load(
        (crowded.data_dir / "ca.pem").read_bytes(), (crowded.data_dir / "ca.key").read_bytes()
    )
    worker = ca.issue_bundle(Principal.worker(watched.id, 0), lifetime=dt.timedelta(hours=1))

    with (
        _profile_channel(crowded, "crowd") as crowd_channel,
        _profile_channel(crowded, "other") as other_channel,
        _profile_channel(crowded, "admin") as admin_channel,
        _channel(crowded, worker.cert_pem, worker.key_pem) as worker_channel,
    ):
        watch = jobs_pb2_grpc.JobsStub(crowd_channel).WatchJob
        streams = [watch(jobs_pb2.WatchJobRequest(job_id=watched.id)) for _ in range(WATCHERS)]
        for stream in streams:
            stream.initial_metadata()  # sent once the server holds the stream open
            assert next(stream).state == common_pb2.QUEUED  # what the store had, before any live event

        refused = watch(jobs_pb2.WatchJobRequest(job_id=watched.id))
        with pytest.raises(grpc.RpcError) as past_cap:
            next(refused)
        assert past_cap.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        refusal = errors.from_rpc_error(past_cap.value)
        assert isinstance(refusal, errors.QuotaExceeded) and refusal.what == "open streams"
        assert refusal.limit == WATCHERS

        got = jobs_pb2_grpc.JobsStub(other_channel).GetJob(
            jobs_pb2.GetJobRequest(job_id=theirs.id), timeout=ANSWERED_WITHIN_S
        )
        assert got.id == theirs.id
        tenants = admin_pb2_grpc.AdminStub(admin_channel).ListTenants(
            admin_pb2.ListTenantsRequest(), timeout=ANSWERED_WITHIN_S
        )
        assert {"crowd", "other"} <= {t.name for t in tenants.tenants}
        worker_pb2_grpc.WorkerStub(worker_channel).Report(
            worker_pb2.WorkerReport(job_id=watched.id, worker=0, heartbeat=worker_pb2.Heartbeat()),
            timeout=ANSWERED_WITHIN_S,
        )

        # A stream the client drops is counted off: as many new ones open (once the server saw them go).
        for stream in streams[:10]:
            stream.cancel()

        def reopened() -> grpc.Call | None:
            stream = watch(jobs_pb2.WatchJobRequest(job_id=watched.id))
            try:
                next(stream)
            except grpc.RpcError as still_full:
                assert still_full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return None
            return stream

        streams = streams[10:] + [wait_for(reopened) for _ in range(10)]

        crowd.cancel(watched.id)
        for stream in streams:  # every watcher gets the end, pushed to it, and its stream closes
            rest = list(stream)
            assert rest[-1].terminal and rest[-1].state == common_pb2.CANCELLED

        # The streams that ended were counted off: the tenant may watch again.
        again = list(watch(jobs_pb2.WatchJobRequest(job_id=watched.id), timeout=60))
        assert again[-1].state == common_pb2.CANCELLED
    other.cancel(theirs.id)
    crowd.close()
    other.close()


def test_each_call_is_logged_as_one_json_line(crowded):
    with crowded.admin() as admin:
        admin.tenants()
    lines = [json.loads(line) for line in crowded.server_log().splitlines() if line.startswith("{")]
    calls = [line for line in lines if line["logger"] == "cantata.server.access"]
    listed = next(c for c in calls if c["method"] == "/cantata.v1.Admin/ListTenants")
    assert listed["principal"] == "spiffe://cantata/admin/admin" and listed["code"] == "OK"
    assert listed["latency_ms"] >= 0 and len(listed["request_id"]) == 32
    refused = next(c for c in calls if c["method"] == "/cantata.v1.Jobs/WatchJob" and c["code"] != "OK")
    assert refused["code"] == "RESOURCE_EXHAUSTED"
    assert any(line["logger"] == "cantata.server.app" and "serving on port" in line["message"] for line in lines)
