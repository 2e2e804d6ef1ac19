"""A worker's reports outlive a server that answers UNAVAILABLE for a while (its audit log is down), within a bound."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest

from cantata.proto.v1 import worker_pb2, worker_pb2_grpc
from cantata.trainer.reporter import retry_unavailable

FULL = "the audit log cannot be written: No space left on device"


class RefusingWorkerService(worker_pb2_grpc.WorkerServicer):
    """Answers ``code`` to the first ``refusals`` reports, then accepts them."""

    def __init__(self, refusals: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE):
        self.refusals, self.code, self.calls = refusals, code, 0

    def Report(self, request, context):
        self.calls += 1
        if self.calls <= self.refusals:
            context.abort(self.code, FULL)
        return worker_pb2.WorkerReportReply(stop=True)


@pytest.fixture
def serve():
    servers = []

    def start(service: RefusingWorkerService) -> worker_pb2_grpc.WorkerStub:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return worker_pb2_grpc.WorkerStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

    yield start
    for server in servers:
        server.stop(None)


def _report(stub: worker_pb2_grpc.WorkerStub):
    request = worker_pb2.WorkerReport(job_id="job-1", worker=0, started=True)
    return lambda: stub.Report(request, timeout=10, wait_for_ready=True)


def test_a_report_refused_as_unavailable_is_sent_again_until_accepted(serve):
    service = RefusingWorkerService(refusals=2)
    reply = retry_unavailable(_report(serve(service)), retry_for=60)
    assert reply.stop and service.calls == 3


def test_retrying_stops_at_its_bound_with_the_servers_reason(serve):
    service = RefusingWorkerService(refusals=10**6)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        retry_unavailable(_report(serve(service)), retry_for=1.0)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and FULL in refused.value.details()
    assert time.monotonic() - started < 1.0 + 10  # gave up at the bound, not after a long backoff
    assert service.calls >= 2


def test_other_refusals_are_not_retried(serve):
    service = RefusingWorkerService(refusals=1, code=grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(grpc.RpcError) as refused:
        retry_unavailable(_report(serve(service)), retry_for=60)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED and service.calls == 1
