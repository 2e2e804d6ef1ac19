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


class RecordingWorkerService(worker_pb2_grpc.WorkerServicer):
    """Keeps every numbered report it gets; loses its answer to the first one (as a server that died after it)."""

    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE):
        self.seen: list[worker_pb2.WorkerReport] = []
        self.code = code

    def Report(self, request, context):
        if request.seq:
            self.seen.append(request)
            if len(self.seen) == 1:
                context.abort(self.code, "gone before it answered")
        return worker_pb2.WorkerReportReply()


def _tls_endpoint(tmp_path, port: int):
    """A CA, a server certificate for localhost and a worker's, as files; the worker's Endpoint."""
    import datetime as dt

    from cantata.security.pki import CertificateAuthority, Principal
    from cantata.trainer.reporter import Endpoint

    ca = CertificateAuthority.create()
    server = ca.issue_bundle(None, lifetime=dt.timedelta(hours=1), dns_names=["localhost"], server=True)
    worker = ca.issue_bundle(Principal.worker("job-1", 0), lifetime=dt.timedelta(hours=1))
    for name, data in (("ca.pem", ca.cert_pem), ("cert.pem", worker.cert_pem), ("key.pem", worker.key_pem)):
        (tmp_path / name).write_bytes(data)
    endpoint = Endpoint(
        f"localhost:{port}", tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem", "job-1", 0
    )
    credentials = grpc.ssl_server_credentials([(server.key_pem, server.cert_pem)], ca.cert_pem, True)
    return endpoint, credentials


def test_reports_made_while_the_server_is_down_arrive_in_order_once_it_is_back(tmp_path):
    from cantata.trainer.reporter import Reporter
    from testkit.platform import free_port

    port = free_port()
    endpoint, credentials = _tls_endpoint(tmp_path, port)
    reporter = Reporter(endpoint)
    try:
        for step in range(1, 6):  # no server yet: queued, training goes on
            reporter.progress(step, loss=1.0, tokens_per_s=1.0, lr=0.1)
        service = RecordingWorkerService()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
        server.add_secure_port(f"localhost:{port}", credentials)
        server.start()
        try:
            reporter.finished(0.5)  # returns once the server has it, and all before it
        finally:
            server.stop(None)
    finally:
        reporter.close()
    # the first answer was lost: that report came again, and the server (by its number) applies it once
    assert [r.seq for r in service.seen] == [1, 1, 2, 3, 4, 5, 6]
    assert [r.progress.step for r in service.seen[1:6]] == [1, 2, 3, 4, 5] and service.seen[-1].HasField("finished")


def test_a_refused_report_fails_the_next_one(tmp_path):
    from cantata.trainer.reporter import Reporter, ReportsLost
    from testkit.platform import free_port

    port = free_port()
    endpoint, credentials = _tls_endpoint(tmp_path, port)
    service = RecordingWorkerService(grpc.StatusCode.PERMISSION_DENIED)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    server.add_secure_port(f"localhost:{port}", credentials)
    server.start()
    reporter = Reporter(endpoint)
    try:
        reporter.started()
        with pytest.raises(ReportsLost, match="report 1 \\(started\\) not taken"):
            reporter.flush()
        with pytest.raises(ReportsLost):
            reporter.message("after")
    finally:
        reporter.close()
        server.stop(None)
    assert [r.seq for r in service.seen] == [1]
