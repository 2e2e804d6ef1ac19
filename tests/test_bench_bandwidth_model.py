"""The wall-clock model behind benchmarks/bench_gasloc_bandwidth.py."""

import pytest

from benchmarks.bandwidth_model import (
    Network,
    allreduce_transfer,
    gossip_transfers,
    schedule,
)

N = 8
NBYTES = 1e6
COMPUTE = 0.1
FAST, SLOW = 50e6, 5e6  # bytes/s
LATENCY = 0.002
RING = [(i, (i + 1) % N) for i in range(N)]  # the slow edge (0, 7) closes the ring


@pytest.fixture
def network():
    return Network(N, FAST, LATENCY, {(0, 7): SLOW})


def _distance_to_slow_edge(i):
    return min(i, N - 1 - i)


def test_a_slow_ring_edge_delays_its_endpoints_and_then_one_more_hop_per_round(network):
    fast = LATENCY + NBYTES / FAST
    slow = LATENCY + NBYTES / SLOW
    rounds = schedule(N, [gossip_transfers(network, RING, NBYTES)] * 6, COMPUTE)
    for t, r in enumerate(rounds):
        for i in range(N):
            d = _distance_to_slow_edge(i)
            # the slow edge's delay reaches worker i after d rounds; before that it runs at the fast pace
            expected = (t + 1 - d) * (COMPUTE + slow) + d * (COMPUTE + fast) if t >= d else (t + 1) * (COMPUTE + fast)
            assert r.finish[i] == pytest.approx(expected), (t, i)
        assert r.skipped == frozenset()
        assert r.sent == (2 * NBYTES,) * N


def test_ring_allreduce_is_bounded_by_the_slowest_link(network):
    seconds = network.ring_allreduce_seconds(NBYTES)
    assert seconds == pytest.approx(2 * (N - 1) / N * NBYTES / SLOW + 2 * (N - 1) * LATENCY)
    off_ring = Network(N, FAST, LATENCY, {(0, 4): SLOW}).ring_allreduce_seconds(NBYTES)
    assert off_ring == pytest.approx(2 * (N - 1) / N * NBYTES / FAST + 2 * (N - 1) * LATENCY)
    rounds = schedule(N, [[allreduce_transfer(network, NBYTES)]] * 3, COMPUTE)
    for t, r in enumerate(rounds):
        assert r.finish == pytest.approx([(t + 1) * (COMPUTE + seconds)] * N)
        assert r.sent == pytest.approx([2 * (N - 1) / N * NBYTES] * N)


def test_a_transfer_waits_for_its_latest_member(network):
    # round 0: only (0, 7) swaps, so 0 and 7 fall behind; round 1: 0 swaps with 1, which must wait for 0
    rounds = schedule(
        N, [gossip_transfers(network, [(0, 7)], NBYTES), gossip_transfers(network, [(0, 1)], NBYTES)], COMPUTE
    )
    slow = LATENCY + NBYTES / SLOW
    assert rounds[0].finish[0] == rounds[0].finish[7] == pytest.approx(COMPUTE + slow)
    assert rounds[0].finish[1] == pytest.approx(COMPUTE)
    assert rounds[1].ready[1] == pytest.approx(2 * COMPUTE)
    assert rounds[1].finish[1] == rounds[1].finish[0] == pytest.approx(2 * COMPUTE + slow + LATENCY + NBYTES / FAST)
    assert rounds[1].finish[7] == pytest.approx(2 * COMPUTE + slow)  # idle in round 1


def test_a_transfer_past_the_deadline_is_skipped_and_its_members_wait_out_the_deadline(network):
    fast = LATENCY + NBYTES / FAST
    deadline = 3 * fast  # well short of the slow swap
    rounds = schedule(N, [gossip_transfers(network, RING, NBYTES)] * 4, COMPUTE, deadline_s=deadline)
    for t, r in enumerate(rounds):
        assert r.skipped == frozenset({(0, 7)})
        # the endpoints wait out the deadline; their neighbours wait for them from the next round on
        assert r.finish[0] == r.finish[7] == pytest.approx((t + 1) * (COMPUTE + deadline))
        assert r.sent[0] == pytest.approx(NBYTES + deadline / (LATENCY + NBYTES / SLOW) * NBYTES)
        assert r.sent[3] == 2 * NBYTES
    assert rounds[0].finish[1] == pytest.approx(COMPUTE + fast)
    assert rounds[1].finish[1] == pytest.approx(2 * COMPUTE + deadline + fast)


def test_a_deadline_longer_than_every_transfer_changes_nothing(network):
    plan = [gossip_transfers(network, RING, NBYTES)] * 3
    assert schedule(N, plan, COMPUTE, deadline_s=10.0) == schedule(N, plan, COMPUTE)


def test_a_network_without_bandwidth_is_refused():
    with pytest.raises(ValueError):
        Network(N, FAST, LATENCY, {(0, 7): 0.0})
