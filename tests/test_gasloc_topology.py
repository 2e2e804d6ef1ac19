import pytest
import torch

from cantata.trainer.gasloc import TOPOLOGIES, UnknownTopology, make_topology

torch.set_num_threads(1)


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("n", [2, 5, 8, 9])
def test_mixing_matrix_is_symmetric_and_doubly_stochastic(name, n):
    topology = make_topology(name, n, seed=7)
    dead_sets = [(), (1,), (0, n - 1)]
    for round in range(4):
        for dead in dead_sets:
            alive = [i for i in range(n) if i not in dead]
            w = topology.mixing_matrix(round, alive=alive)
            assert torch.allclose(w, w.T)
            assert torch.allclose(w.sum(dim=0), torch.ones(n, dtype=torch.float64))
            assert torch.allclose(w.sum(dim=1), torch.ones(n, dtype=torch.float64))
            assert (w >= 0).all()
            for i in dead:  # a dead worker's weight all went back to itself
                assert w[i, i] == 1.0


def test_dead_peer_weight_goes_back_to_self():
    topology = make_topology("ring", 6)
    full = topology.mixing_matrix(0)
    without_2 = topology.mixing_matrix(0, alive=[0, 1, 3, 4, 5])
    assert without_2[1, 2] == 0 and without_2[3, 2] == 0
    assert without_2[1, 1] == pytest.approx(full[1, 1] + full[1, 2])
    assert without_2[0, 0] == full[0, 0]


@pytest.mark.parametrize(
    "name,n,degree",
    [("ring", 8, 2), ("ring", 2, 1), ("torus", 16, 4), ("torus", 8, 3), ("exponential", 8, 5), ("complete", 8, 7)],
)
def test_static_degrees_and_metropolis_step(name, n, degree):
    topology = make_topology(name, n)
    assert all(len(topology.neighbors(i, 0)) == degree for i in range(n))
    assert topology.metropolis_step(3) == pytest.approx(1 / (degree + 1))


def test_complete_graph_metropolis_is_exact_averaging():
    w = make_topology("complete", 5).mixing_matrix(0)
    assert torch.allclose(w, torch.full((5, 5), 0.2, dtype=torch.float64))


@pytest.mark.parametrize("name,peers", [("one-peer", 1), ("two-peer", 2)])
def test_matchings_agree_across_workers_for_same_seed_and_round(name, peers):
    n = 8
    # Each worker builds its own topology object, as separate processes would.
    per_worker = [make_topology(name, n, seed=1234) for _ in range(n)]
    for round in range(20):
        views = [t.neighbors(i, round) for i, t in enumerate(per_worker)]
        for i, mine in enumerate(views):
            for j in mine:
                assert i in views[j]
            assert len(mine) >= 1 and len(mine) <= peers
        assert len({t.edges(round) for t in per_worker}) == 1
    if peers == 1:
        assert all(len(per_worker[0].neighbors(i, 3)) == 1 for i in range(n))
    rounds = {per_worker[0].edges(r) for r in range(20)}
    assert len(rounds) > 10
    other_seed = make_topology(name, n, seed=1235)
    assert any(other_seed.edges(r) != per_worker[0].edges(r) for r in range(5))


def test_one_peer_matching_is_pairwise_averaging_and_odd_worker_sits_out():
    topology = make_topology("one-peer", 7, seed=3)
    assert topology.metropolis_step(0) == 0.5
    w = topology.mixing_matrix(0)
    lonely = [i for i in range(7) if not topology.neighbors(i, 0)]
    assert len(lonely) == 1 and w[lonely[0], lonely[0]] == 1.0
    for i in range(7):
        if i not in lonely:
            (j,) = topology.neighbors(i, 0)
            assert w[i, i] == 0.5 and w[i, j] == 0.5


def test_unknown_topology_is_refused():
    with pytest.raises(UnknownTopology):
        make_topology("star", 4)
