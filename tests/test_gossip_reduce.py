"""DiLoCo's streamed all-reduce (``GossipNode.allreduce``) over the real mutual-TLS transport: exact, equal on
every worker, ``2 (n - 1) / n`` of the vector on the wire, and failing closed."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta

import grpc
import pytest
import torch

from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.gossip import GossipNode, gossip_server_name
from cantata.trainer.gossip.allreduce import AllReduceFailed
from cantata.trainer.gossip.reduce import GATHER_BYTES
from cantata.trainer.gossip.wire import REDUCE, Chunk, decode, encode

torch.set_num_threads(1)

JOB = "job-reduce"
ROUNDS = itertools.count(1)  # the module's nodes only go forward


def _node(ca, job, index, **kwargs):
    bundle = ca.issue_bundle(
        Principal.worker(job, index),
        dns_names=[gossip_server_name(JOB, index)],  # a stranger must get past TLS to meet the job check
        lifetime=timedelta(hours=1),
        server=True,
    )
    return GossipNode(index, job, bundle, deadline_s=30.0, chunk_bytes=4 << 10, **kwargs)


@pytest.fixture(scope="module")
def cluster():
    """Eight started nodes; a test uses the first n."""
    ca = CertificateAuthority.create()
    nodes = [_node(ca, JOB, i) for i in range(8)]
    addresses = {i: node.start() for i, node in enumerate(nodes)}
    yield ca, nodes, addresses
    for node in nodes:
        node.stop()


def _on_all(work, indices):
    """Run ``work(i)`` for every index at once; ``{i: result or exception}``."""
    results: dict = {}

    def run(i):
        try:
            results[i] = work(i)
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _reduce(nodes, addresses, members, vectors, **kwargs):
    round_ = next(ROUNDS)
    return _on_all(
        lambda i: nodes[i].allreduce(round_, {p: addresses[p] for p in members if p != i}, vectors[i], **kwargs),
        members,
    )


@pytest.mark.parametrize("n", range(2, 9))
def test_the_average_is_exact_and_equal_on_every_worker_for_odd_sizes(cluster, n):
    _, nodes, addresses = cluster
    for dim in (3, 1_001, 40_009):  # fewer elements than workers, one hop, and two hops in many chunks
        vectors = {i: torch.randn(dim, generator=torch.Generator().manual_seed(10 * n + i)) for i in range(n)}
        results = _reduce(nodes, addresses, list(range(n)), vectors)
        mean = torch.stack(list(vectors.values())).double().mean(0)
        for i in range(n):
            total, traffic = results[i]
            assert torch.allclose(total.double() / n, mean, atol=1e-6, rtol=0), (n, dim)
            assert torch.equal(total, results[0].total)  # every worker ends with the same bits
            assert set(traffic) == set(range(n)) - {i}


@pytest.mark.parametrize("n", [3, 8])
def test_large_vectors_cost_2_n_minus_1_over_n_of_the_vector_per_worker(cluster, n):
    _, nodes, addresses = cluster
    dim = 3 * GATHER_BYTES // 4 + 1  # past the one-hop size: reduce-scatter, then all-gather
    vectors = {i: torch.randn(dim, generator=torch.Generator().manual_seed(i)) for i in range(n)}
    before = [node.bytes_sent for node in nodes[:n]]
    results = _reduce(nodes, addresses, list(range(n)), vectors)
    optimal = 2 * (n - 1) / n * dim * 4
    for i in range(n):
        payload = sum(sent for sent, _ in results[i].traffic.values())
        assert optimal - 8 * n <= payload <= optimal + 8 * n  # shares differ by at most an element
        assert payload <= nodes[i].bytes_sent - before[i] < 1.03 * optimal + 4000  # plus chunk headers


def test_a_narrow_wire_dtype_leaves_every_worker_with_the_same_bits(cluster):
    _, nodes, addresses = cluster
    for dim in (1_000, 50_001):  # one hop and two
        vectors = {i: torch.randn(dim, generator=torch.Generator().manual_seed(i)) for i in range(5)}
        results = _reduce(nodes, addresses, list(range(5)), vectors, wire_dtype=torch.bfloat16)
        expected = torch.stack(list(vectors.values())).sum(0)
        for i in range(5):
            assert torch.equal(results[i].total, results[0].total)
            assert torch.allclose(results[i].total, expected, atol=0.1)
            assert results[i].total.dtype == torch.float32


def test_a_member_that_is_gone_fails_the_all_reduce_at_once_and_the_next_round_works(cluster):
    _, nodes, addresses = cluster
    vectors = {i: torch.ones(10_000) for i in range(2)}
    round_ = next(ROUNDS)
    ring = {1: addresses[1], 2: addresses[2]}, {0: addresses[0], 2: addresses[2]}  # worker 2 never comes
    start = time.monotonic()
    failed = _on_all(lambda i: nodes[i].allreduce(round_, ring[i], vectors[i], gone=lambda: [2]), [0, 1])
    assert all(isinstance(failed[i], AllReduceFailed) for i in (0, 1)), failed
    assert time.monotonic() - start < 25.0  # given up when worker 2 was known gone, not at the 30 s deadline
    after = _reduce(nodes, addresses, [0, 1], vectors)
    assert all(torch.equal(after[i].total, torch.full((10_000,), 2.0)) for i in (0, 1))


def test_a_worker_of_another_job_is_refused_and_no_member_gets_a_sum(cluster):
    ca, _, _ = cluster
    refused: list[str] = []
    impostor = GossipNode(  # claims to be worker 0 of this job, with a certificate of another job
        0,
        JOB,
        ca.issue_bundle(
            Principal.worker("job-other", 0), dns_names=[gossip_server_name(JOB, 0)], lifetime=timedelta(hours=1)
        ),
        deadline_s=30.0,
    )
    victims = [
        _node(ca, JOB, i, on_refused=lambda address, principal, reason: refused.append(principal)) for i in (1, 2)
    ]
    everyone = {0: impostor, 1: victims[0], 2: victims[1]}
    book = {i: node.start() for i, node in everyone.items()}
    try:
        results = _on_all(
            lambda i: everyone[i].allreduce(
                1, {p: a for p, a in book.items() if p != i}, torch.ones(5_000), deadline_s=3.0
            ),
            list(everyone),
        )
    finally:
        for node in everyone.values():
            node.stop()
    assert all(isinstance(results[i], AllReduceFailed) for i in everyone), results
    assert refused and all("job-other" in principal for principal in refused), refused


def test_a_corrupt_chunk_fails_the_all_reduce_closed(cluster):
    _, nodes, addresses = cluster
    round_ = next(ROUNDS)
    forged = Chunk(round_, 0, 0, 1, 4_000, "float32", checksum=12345, data=bytes(4_000), step=0)
    call = (
        nodes[0]
        ._link(1, addresses[1])[0]
        .stream_stream(REDUCE, request_serializer=encode, response_deserializer=decode)
    )
    start = time.monotonic()
    outcome = _on_all(
        lambda i: (
            nodes[1].allreduce(round_, {0: addresses[0]}, torch.ones(1_000), deadline_s=20.0)
            if i
            else list(call(iter([forged]), timeout=20.0))
        ),
        [0, 1],
    )
    assert isinstance(outcome[1], AllReduceFailed) and "checksum" in str(outcome[1]), outcome
    assert isinstance(outcome[0], grpc.RpcError)  # the forger's stream is aborted too
    assert time.monotonic() - start < 15.0  # at once, not at the deadline
