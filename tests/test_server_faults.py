"""The server itself: its health service, and events read while it runs.

A server stopped or killed mid-job, and the jobs it re-adopts, are in tests/test_server_restart.py.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


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


def test_health_service_reports_serving(platform):
    channel = grpc.secure_channel(platform.enroll_address, grpc.ssl_channel_credentials(platform.ca_pem))
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
