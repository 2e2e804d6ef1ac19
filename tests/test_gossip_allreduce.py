"""DiLoCo's ring all-reduce over the real mutual-TLS gossip transport: exact, weighted, and bandwidth-optimal."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.gasloc import OuterStep, make_topology
from cantata.trainer.gossip import GossipNode, gossip_server_name
from cantata.trainer.gossip.allreduce import ring_allreduce

torch.set_num_threads(1)

JOB = "job-allreduce"
STRIDE = 64  # wire rounds per outer round


@pytest.fixture(scope="module")
def cluster():
    """Five started nodes; a test uses the first n."""
    ca = CertificateAuthority.create()
    nodes = [
        GossipNode(
            i,
            JOB,
            ca.issue_bundle(
                Principal.worker(JOB, i),
                dns_names=[gossip_server_name(JOB, i)],
                lifetime=timedelta(hours=1),
                server=True,
            ),
            deadline_s=30.0,
            chunk_bytes=64 << 10,
        )
        for i in range(5)
    ]
    addresses = {i: node.start() for i, node in enumerate(nodes)}
    yield nodes, addresses
    for node in nodes:
        node.stop()


class Rounds:
    """Hands out strictly growing wire-round bases, shared by the module's tests (the mailboxes only go forward)."""

    next = 0

    @classmethod
    def take(cls) -> int:
        cls.next += STRIDE
        return cls.next


def _on_all(n, work):
    """Run ``work(i)`` for workers 0..n-1 at once; return their results in order."""
    results: list = [None] * n
    errors: list = []

    def run(i):
        try:
            results[i] = work(i)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _allreduce(nodes, addresses, n, base):
    def sum_for(i):
        def swap(step, payloads):
            return nodes[i].exchange(base + step, {p: addresses[p] for p in payloads}, payloads)

        return lambda vector: ring_allreduce(vector, list(range(n)), i, swap)

    return sum_for


@pytest.mark.parametrize("n", [2, 3, 5])
def test_ring_allreduce_over_mtls_sums_exactly_and_sends_2_n_minus_1_over_n(cluster, n):
    nodes, addresses = cluster
    dim = 100_003  # not a multiple of 2n: chunks are padded
    vectors = [torch.randn(dim, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    before = [node.bytes_sent for node in nodes[:n]]
    sum_for = _allreduce(nodes, addresses, n, Rounds.take())
    sums = _on_all(n, lambda i: sum_for(i)(vectors[i]))
    expected = torch.stack(vectors).double().sum(0)
    for s in sums:
        assert torch.allclose(s.double(), expected, atol=1e-4)
        assert torch.equal(s, sums[0])  # every worker ends with the same bits
    sent = [node.bytes_sent - b for node, b in zip(nodes[:n], before, strict=True)]
    optimal = 2 * (n - 1) / n * dim * 4
    for s in sent:  # counted from the serialized messages: the payload plus headers and commits
        assert optimal <= s < 1.03 * optimal + 2000, (s, optimal)

    # the complete-graph gossip DiLoCo used before: every worker sends its whole vector to all n - 1 peers
    base = Rounds.take()
    before = [node.bytes_sent for node in nodes[:n]]
    _on_all(n, lambda i: nodes[i].exchange(base, {p: addresses[p] for p in range(n) if p != i}, vectors[i]))
    gossip = [node.bytes_sent - b for node, b in zip(nodes[:n], before, strict=True)]
    assert all(g >= (n - 1) * dim * 4 for g in gossip)
    assert max(sent) < 1.03 * (2 / n) * min(gossip)  # 2(n-1)/n against n-1 vectors


@pytest.mark.parametrize("weights", [None, [3.0, 1.0, 7.0]])
def test_diloco_ring_rounds_equal_nesterov_sgd_on_the_weighted_mean_pseudo_gradient(cluster, weights):
    """Equal weights: DiLoCo exactly. Steps done as weights: Nesterov on -sum w_i g_i / sum w_i."""
    nodes, addresses = cluster
    n, dim, rounds, eta, gamma = 3, 513, 4, 0.7, 0.9
    w = torch.tensor(weights or [1.0] * n)
    theta0 = torch.randn(dim, generator=torch.Generator().manual_seed(0))
    reference = torch.nn.Parameter(theta0.clone())
    sgd = torch.optim.SGD([reference], lr=eta, momentum=gamma, nesterov=True)
    steps = [OuterStep(make_topology("complete", n), i, eta, gamma) for i in range(n)]
    thetas = [theta0.clone() for _ in range(n)]
    for t in range(rounds):
        moves = torch.randn(n, dim, generator=torch.Generator().manual_seed(100 + t))
        after = [theta + 0.1 * moves[i] for i, theta in enumerate(thetas)]
        pseudo = torch.stack([a - reference.detach() for a in after])
        reference.grad = -(w[:, None] * pseudo).sum(0) / w.sum()
        sgd.step()
        sum_for = _allreduce(nodes, addresses, n, Rounds.take())

        def outer_round(i, t=t, thetas=thetas, after=after, sum_for=sum_for):
            return steps[i].round_mean(t, thetas[i], after[i], lambda r, v: sum_for(i)(v), float(w[i]))

        results = _on_all(n, outer_round)
        thetas = [theta for theta, _ in results]
        assert all(stats.mixed == stats.peers and not stats.skipped for _, stats in results)
        for theta in thetas:
            assert torch.allclose(theta, reference.detach(), atol=1e-5, rtol=0)
    assert not torch.allclose(reference.detach(), theta0, atol=1e-2)


def test_a_failed_allreduce_applies_the_workers_own_proposal():
    step = OuterStep(make_topology("complete", 3), 0, outer_lr=0.5, outer_momentum=0.0)
    theta, after = torch.zeros(4), torch.ones(4)
    theta_next, stats = step.round_mean(0, theta, after, lambda r, v: None)
    assert torch.equal(theta_next, torch.full((4,), 0.5))
    assert stats.mixed == () and stats.skipped == (1, 2)
