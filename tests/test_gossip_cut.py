"""Links cut at random moments: both ends of every edge agree whether it was used, so the workers' mean holds."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import torch

from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.gossip import GossipNode, gossip_server_name
from testkit.waiting import wait_for
from tests.faultproxy import FaultProxy

torch.set_num_threads(1)

JOB = "job-cut"
N, DIM, ROUNDS = 3, 64_000, 12
ALPHA = 1 / 3


def _node(ca, i):
    bundle = ca.issue_bundle(
        Principal.worker(JOB, i), dns_names=[gossip_server_name(JOB, i)], lifetime=timedelta(hours=1), server=True
    )
    return GossipNode(i, JOB, bundle, deadline_s=1.0, chunk_bytes=16 << 10, commit_grace_s=1.0)


def test_random_cuts_leave_every_edge_used_on_both_ends_or_neither_and_keep_the_mean():
    ca = CertificateAuthority.create()
    nodes = [_node(ca, i) for i in range(N)]
    direct = [node.start() for node in nodes]
    # every link into workers 1 and 2 (the callees of all three edges) runs through a proxy that a cutter resets
    proxies = {i: FaultProxy(int(direct[i].rsplit(":", 1)[1])) for i in (1, 2)}
    addresses = {0: direct[0], **{i: f"127.0.0.1:{p.port}" for i, p in proxies.items()}}
    rng = random.Random(20)
    stop = threading.Event()

    def cutter():
        while not stop.wait(rng.uniform(0.0, 0.15)):
            rng.choice(list(proxies.values())).set("reset", for_seconds=rng.uniform(0.0, 0.1))

    barrier = threading.Barrier(N)
    kept: dict[tuple[int, int], set[int]] = {}
    mixed: dict[tuple[int, int], torch.Tensor] = {}
    payloads = {
        (t, i): torch.randn(DIM, generator=torch.Generator().manual_seed(100 * t + i))
        for t in range(ROUNDS)
        for i in range(N)
    }

    def worker(i):
        for t in range(ROUNDS):
            barrier.wait()
            if t == ROUNDS - 1 and i == 0:
                proxies[1].set("reset", for_seconds=1.0)  # one certain cut: the whole round's link 0-1 is down
            y = payloads[(t, i)]
            got = nodes[i].exchange(t, {j: addresses[j] for j in range(N) if j != i}, y)
            kept[(t, i)] = set(got)
            mixed[(t, i)] = y + ALPHA * sum((g - y for g in got.values()), torch.zeros(DIM))

    threading.Thread(target=cutter, daemon=True).start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        stop.set()
        for p in proxies.values():
            p.close()
        for node in nodes:
            node.stop()

    used = cut = 0
    for t in range(ROUNDS):
        for i in range(N):
            for j in range(i + 1, N):
                assert (j in kept[(t, i)]) == (i in kept[(t, j)]), f"round {t}: edge {i}-{j} used on one end only"
                used += j in kept[(t, i)]
                cut += j not in kept[(t, i)]
        mean_y = torch.stack([payloads[(t, i)] for i in range(N)]).double().mean(0)
        mean_z = torch.stack([mixed[(t, i)] for i in range(N)]).double().mean(0)
        assert torch.allclose(mean_z, mean_y, atol=1e-5), f"round {t}: the workers' mean moved"
    assert used and cut, (used, cut)  # both outcomes happened: the cuts really cut, and links still worked


def test_a_refused_link_fails_its_edge_at_once_not_at_the_deadline():
    ca = CertificateAuthority.create()
    node = _node(ca, 0)
    node.start()
    closed = FaultProxy(1)
    closed.set("refuse")
    try:
        began = time.monotonic()
        got = node.exchange(0, {1: f"127.0.0.1:{closed.port}"}, torch.zeros(8), deadline_s=120.0)
        assert got == {}
        assert time.monotonic() - began < 60.0  # half the deadline: the refusal ended the wait
    finally:
        closed.close()
        node.stop()


def test_a_peer_the_round_does_not_name_is_refused_so_neither_end_uses_the_edge():
    # Worker 1's round is with worker 2 only (it left worker 0 out, say as done with the round). Worker 0 still
    # dials it: worker 1 must refuse at once rather than take worker 0's payload and say yes to its commit.
    ca = CertificateAuthority.create()
    nodes = [_node(ca, i) for i in range(3)]
    addresses = [node.start() for node in nodes]
    try:
        results: dict[int, dict] = {}
        one = threading.Thread(
            target=lambda: results.update({1: nodes[1].exchange(0, {2: addresses[2]}, torch.ones(8))})
        )
        one.start()
        wait_for(lambda: nodes[1].mailbox.outgoing(0, timeout=0.1) is not None)  # worker 1's round 0 is open
        began = time.monotonic()
        results[0] = nodes[0].exchange(0, {1: addresses[1]}, torch.zeros(8), deadline_s=120.0)
        refused_after = time.monotonic() - began
        results[2] = nodes[2].exchange(0, {1: addresses[1]}, torch.full((8,), 2.0))
        one.join()
        assert results[0] == {} and refused_after < 60.0  # refused, not left to its deadline
        assert set(results[1]) == {2} and torch.equal(results[1][2], torch.full((8,), 2.0))
        assert set(results[2]) == {1}
    finally:
        for node in nodes:
            node.stop()


def test_a_round_gives_up_on_a_peer_as_soon_as_it_is_reported_gone():
    # Worker 1 waits for worker 0's call, which will not come (worker 0 is done with the round without it). The
    # round asks ``gone`` while it waits and ends once worker 0 is named, long before its deadline.
    ca = CertificateAuthority.create()
    nodes = [_node(ca, i) for i in range(2)]
    addresses = [node.start() for node in nodes]
    asked = threading.Event()
    reported = threading.Event()
    polls = []

    def gone():
        polls.append(reported.is_set())
        asked.set()
        return [0] if reported.is_set() else []

    try:
        result: list[dict] = []
        one = threading.Thread(
            target=lambda: result.append(nodes[1].exchange(0, {0: addresses[0]}, torch.ones(8), 120.0, gone=gone))
        )
        began = time.monotonic()
        one.start()
        asked.wait()
        assert one.is_alive()  # still waiting for worker 0 while nobody says it is gone
        reported.set()
        one.join()
        assert result == [{}] and time.monotonic() - began < 60.0
        assert polls[-1] is True and False in polls
    finally:
        for node in nodes:
            node.stop()
