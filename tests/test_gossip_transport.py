import functools
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import grpc
import pytest
import torch

from cantata.proto.v1 import gossip_pb2_grpc
from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.gossip import GossipNode, gossip_server_name, heap
from cantata.trainer.gossip.chunks import Assembly
from cantata.trainer.gossip.client import exchange_with
from testkit.waiting import wait_for

torch.set_num_threads(1)

JOB = "job-a"
CHUNK = 1 << 20


def _bundle(ca, job, worker):
    return ca.issue_bundle(
        Principal.worker(job, worker),
        dns_names=[gossip_server_name(job, worker)],
        lifetime=timedelta(hours=1),
        server=True,
    )


@pytest.fixture(scope="module")
def ca():
    return CertificateAuthority.create()


@pytest.fixture
def nodes(ca):
    started = []

    def make(worker, job=JOB, deadline_s=5.0, authority=None, **kwargs):
        node = GossipNode(
            worker, job, _bundle(authority or ca, job, worker), deadline_s=deadline_s, chunk_bytes=CHUNK, **kwargs
        )
        node.start()
        started.append(node)
        return node

    yield make
    for node in started:
        node.stop()


def _in_parallel(*calls):
    results = [None] * len(calls)

    def run(k, fn):
        results[k] = fn()

    threads = [threading.Thread(target=run, args=(k, fn)) for k, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _channel(address, bundle, job, callee, with_cert=True):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=bundle.ca_pem,
        private_key=bundle.key_pem if with_cert else None,
        certificate_chain=bundle.cert_pem if with_cert else None,
    )
    return grpc.secure_channel(
        address, credentials, options=[("grpc.ssl_target_name_override", gossip_server_name(job, callee))]
    )


def _wait_for_round(node, round):
    """Until ``node`` has posted its payload for ``round``: its exchange has begun."""
    wait_for(lambda: node.mailbox.outgoing(round, timeout=0.1) is not None)


def _call(channel):
    """Exchange as worker 1 with worker 0 over ``channel``."""
    exchange_with([channel], 0, 1, torch.zeros(10), Assembly(0, 0, bytearray(40)), timeout=5, chunk_bytes=CHUNK)


def test_two_workers_of_a_job_exchange_bit_exact(nodes):
    a, b = nodes(0), nodes(1)
    gen = torch.Generator().manual_seed(0)
    # Rounds 4 and 5 reuse the receive buffers of the rounds before them.
    rounds = [
        (0, torch.float32),
        (1, torch.bfloat16),
        (2, torch.uint8),
        (3, torch.float32),
        (4, torch.float32),
        (5, torch.float32),
    ]
    buffers = {}
    for round, dtype in rounds:
        numel = 3 * CHUNK // 4 + 12345  # several chunks, the last one partial
        x = (
            torch.randn(numel, generator=gen).to(dtype)
            if dtype != torch.uint8
            else torch.randint(0, 256, (numel,), generator=gen, dtype=torch.uint8)
        )
        y = (
            torch.randn(numel, generator=gen).to(dtype)
            if dtype != torch.uint8
            else torch.randint(0, 256, (numel,), generator=gen, dtype=torch.uint8)
        )
        got_a, got_b = _in_parallel(
            functools.partial(a.exchange, round, {1: b.address}, x),
            functools.partial(b.exchange, round, {0: a.address}, y),
        )
        assert set(got_a) == {1} and set(got_b) == {0}
        assert got_a[1].dtype == dtype and torch.equal(got_a[1], y)
        buffers[round] = got_a[1].data_ptr()
        assert torch.equal(got_b[0], x)
    assert buffers[3] == buffers[4] == buffers[5]


def test_three_workers_ring_round(nodes):
    ring = [nodes(i) for i in range(3)]
    payloads = [torch.full((1000,), float(i)) for i in range(3)]
    results = _in_parallel(
        *[
            (lambda i=i: ring[i].exchange(0, {j: ring[j].address for j in range(3) if j != i}, payloads[i]))
            for i in range(3)
        ]
    )
    for i, got in enumerate(results):
        assert {j: float(t[0]) for j, t in got.items()} == {j: float(j) for j in range(3) if j != i}


def test_peer_of_another_job_is_refused_and_reported(ca, nodes):
    refusals = []
    a = nodes(0, deadline_s=2.0, on_refused=lambda address, principal, reason: refusals.append((principal, reason)))
    intruder = _bundle(ca, "job-b", 1)
    results = {}
    waiting = threading.Thread(target=lambda: results.update(a.exchange(0, {1: "127.0.0.1:9"}, torch.ones(10))))
    waiting.start()
    _wait_for_round(a, 0)
    with _channel(a.address, intruder, JOB, 0) as channel, pytest.raises(grpc.RpcError) as refused:
        _call(channel)
    waiting.join()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    principal, reason = refusals[0]
    assert principal == "spiffe://cantata/job/job-b/worker/1"
    assert "not a worker of job job-a" in reason
    assert results == {}


def test_worker_claiming_another_index_is_refused(ca, nodes):
    a = nodes(0, deadline_s=2.0)
    liar = _bundle(ca, JOB, 2)  # a real worker of the job, sending chunks as worker 1
    threading.Thread(target=lambda: a.exchange(0, {1: "127.0.0.1:9"}, torch.ones(10))).start()
    _wait_for_round(a, 0)
    with _channel(a.address, liar, JOB, 0) as channel, pytest.raises(grpc.RpcError) as refused:
        _call(channel)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_caller_without_certificate_or_from_another_ca_is_refused(ca, nodes):
    a = nodes(0)
    own = _bundle(ca, JOB, 1)
    foreign = _bundle(CertificateAuthority.create(), JOB, 1)
    no_certificate = grpc.ssl_channel_credentials(root_certificates=own.ca_pem)
    foreign_certificate = grpc.ssl_channel_credentials(own.ca_pem, foreign.key_pem, foreign.cert_pem)
    for credentials in (no_certificate, foreign_certificate):
        channel = grpc.secure_channel(
            a.address, credentials, options=[("grpc.ssl_target_name_override", gossip_server_name(JOB, 0))]
        )
        with channel, pytest.raises(grpc.RpcError) as refused:
            _call(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


class _RecordingGossip(gossip_pb2_grpc.GossipServicer):
    """A server that takes anything: only the caller's own check can protect the payload."""

    def __init__(self):
        self.calls = 0

    def Exchange(self, request_iterator, context):
        self.calls += 1
        yield from ()


def test_caller_sends_nothing_to_a_server_of_another_job(ca, nodes):
    a = nodes(0, deadline_s=1.5)
    other = _bundle(ca, "job-b", 1)
    recorder = _RecordingGossip()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    gossip_pb2_grpc.add_GossipServicer_to_server(recorder, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(other.key_pem, other.cert_pem)]))
    server.start()
    try:
        assert a.exchange(0, {1: f"127.0.0.1:{port}"}, torch.ones(10)) == {}
    finally:
        server.stop(None)
    assert recorder.calls == 0


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_dead_and_stalled_peers_are_skipped_within_the_deadline(nodes):
    deadline = 1.5
    a = nodes(0, deadline_s=deadline)
    stalled = nodes(1)  # alive but never reaches the round
    live = nodes(3)
    payload = torch.arange(100, dtype=torch.float32)
    start = time.monotonic()
    got, from_live = _in_parallel(
        lambda: a.exchange(0, {1: stalled.address, 2: _closed_port(), 3: live.address}, payload),
        lambda: live.exchange(0, {0: a.address}, payload * 2),
    )
    elapsed = time.monotonic() - start
    assert set(got) == {3} and torch.equal(got[3], payload * 2)
    assert torch.equal(from_live[0], payload)
    assert elapsed < deadline + 1.0


def test_exchange_before_start_or_of_an_unsupported_dtype_is_an_error(ca, nodes):
    node = GossipNode(0, JOB, _bundle(ca, JOB, 0))
    with pytest.raises(RuntimeError):
        node.exchange(0, {}, torch.ones(1))
    with pytest.raises(ValueError, match="cannot carry"):
        nodes(1).exchange(0, {}, torch.ones(1, dtype=torch.complex64))


def test_heap_thresholds_follow_the_largest_chunk_size(monkeypatch):
    calls = []

    class FakeLibc:
        def mallopt(self, option, value):
            calls.append((option, value))
            return 1

    monkeypatch.setattr(heap.ctypes, "CDLL", lambda name: FakeLibc())
    monkeypatch.setattr(heap, "_tuned_for", 0)
    heap.reuse_message_memory(1 << 20)
    heap.reuse_message_memory(1 << 19)  # a smaller chunk never lowers them
    assert calls == [(heap._M_MMAP_THRESHOLD, 4 << 20), (heap._M_TRIM_THRESHOLD, 8 << 20)]
    heap.reuse_message_memory(1 << 21)
    assert calls[2:] == [(heap._M_MMAP_THRESHOLD, 8 << 20), (heap._M_TRIM_THRESHOLD, 16 << 20)]
