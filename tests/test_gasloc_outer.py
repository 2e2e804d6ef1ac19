import pytest
import torch

from cantata.security.anomaly import LayerLayout, ScreeningConfig, UpdateScreener, Verdict
from cantata.trainer.gasloc import GASLoCOuter, OuterStep, Simulator, make_topology
from cantata.trainer.gasloc.outer import WEIGHT_CAP, with_weight

torch.set_num_threads(1)


def _inner_steps(thetas, round, scale=0.1):
    """Stand-in for H inner steps: a different move per worker and round."""
    g = torch.Generator().manual_seed(1000 + round)
    return [theta + scale * torch.randn(theta.shape, generator=g) for theta in thetas]


@pytest.mark.parametrize("eta,gamma", [(0.7, 0.9), (1.0, 0.5), (0.3, 0.99)])
def test_complete_graph_equals_diloco_nesterov_outer_step(eta, gamma):
    n, dim, rounds = 4, 257, 6
    theta0 = torch.randn(dim, generator=torch.Generator().manual_seed(0))
    sim = Simulator(make_topology("complete", n), outer_lr=eta, outer_momentum=gamma)
    thetas = [theta0.clone() for _ in range(n)]

    reference = torch.nn.Parameter(theta0.clone())
    sgd = torch.optim.SGD([reference], lr=eta, momentum=gamma, nesterov=True)
    for t in range(rounds):
        after = _inner_steps(thetas, t)
        reference.grad = -torch.stack([a - reference.detach() for a in after]).mean(dim=0)
        sgd.step()
        thetas, stats = sim.round(t, thetas, after)
        assert all(s.mixed == s.peers and len(s.peers) == n - 1 for s in stats.values())
        for theta in thetas:
            assert torch.allclose(theta, reference.detach(), atol=1e-6, rtol=0)
    assert not torch.allclose(reference.detach(), theta0, atol=1e-2)


def test_round_matches_mixing_matrix_and_keeps_live_mean_with_dead_peer():
    n, dim = 6, 64
    topology = make_topology("ring", n)
    sim = Simulator(topology, outer_lr=0.8, outer_momentum=0.0)
    thetas = [torch.randn(dim, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    after = _inner_steps(thetas, 0)
    dead = {2}
    nexts, stats = sim.round(0, thetas, after, dead=dead)
    ys = torch.stack([t + 0.8 * (a - t) for t, a in zip(thetas, after, strict=True)]).double()
    w = topology.mixing_matrix(0, alive=[i for i in range(n) if i not in dead])
    expected = w @ ys
    for i in range(n):
        if i in dead:
            assert torch.equal(nexts[i], thetas[i]) and i not in stats
        else:
            assert torch.allclose(nexts[i].double(), expected[i], atol=1e-5)
    assert stats[1].skipped == (2,) and stats[3].skipped == (2,) and stats[0].skipped == ()
    live = [i for i in range(n) if i not in dead]
    assert torch.allclose(torch.stack([nexts[i] for i in live]).mean(0), ys[live].float().mean(0), atol=1e-5)


@pytest.mark.parametrize("compression", ["bf16", "int8"])
def test_lossy_gossip_keeps_the_workers_mean_exact(compression):
    n, dim = 8, 3000
    sim = Simulator(make_topology("one-peer", n, seed=5), outer_lr=1.0, outer_momentum=0.0, compression=compression)
    thetas = [torch.randn(dim, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    mean = torch.stack(thetas).mean(0)
    spread = torch.stack(thetas).std(0).mean()
    for t in range(10):
        thetas, _ = sim.round(t, thetas, thetas)
    assert torch.allclose(torch.stack(thetas).mean(0), mean, atol=1e-5)
    assert torch.stack(thetas).std(0).mean() < 0.2 * spread  # and the workers still converge
    assert sim.bytes_sent[0] < 10 * dim * 4 * 0.6  # compressed: well under float32 size


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def test_module_outer_writes_theta_next_into_parameters():
    """Two workers on the complete graph: one wraps a Module, its peer is a bare OuterStep."""
    eta, gamma = 0.7, 0.9
    model = _model(0)
    peer_model = _model(0)
    outer = GASLoCOuter(model.parameters(), make_topology("complete", 2), 0, eta, gamma)
    peer = OuterStep(make_topology("complete", 2), 1, eta, gamma)
    peer_theta = outer.theta.clone()
    reference = torch.nn.Parameter(outer.theta.clone())
    sgd = torch.optim.SGD([reference], lr=eta, momentum=gamma, nesterov=True)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    peer_inner = torch.optim.AdamW(peer_model.parameters(), lr=1e-2)
    x = torch.randn(32, 5, generator=torch.Generator().manual_seed(1))
    for t in range(4):
        for m, opt, target in ((model, inner, 1.0), (peer_model, peer_inner, -1.0)):
            for _ in range(3):
                opt.zero_grad()
                ((m(x) - target) ** 2).mean().backward()
                opt.step()
        mine_after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        peer_after = torch.cat([p.detach().reshape(-1) for p in peer_model.parameters()])
        reference.grad = reference.detach() - (mine_after + peer_after) / 2
        sgd.step()

        def exchange(r, peers, wire, peer_theta=peer_theta, peer_after=peer_after):
            assert peers == [1]
            exchange.proposal = peer.propose(r, peer_theta, peer_after)
            exchange.mine = wire
            return {1: exchange.proposal.wire}

        stats = outer.round(t, exchange)
        peer_theta, _ = peer.finish(exchange.proposal, {0: exchange.mine})
        assert stats.pseudo_gradient_norm > 0 and stats.mixed == (1,)
        now = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert torch.allclose(now, reference.detach(), atol=1e-6)
        assert torch.allclose(peer_theta, reference.detach(), atol=1e-6)
        with torch.no_grad():  # the peer's model continues from its own theta_{t+1}
            torch.nn.utils.vector_to_parameters(peer_theta.clone(), peer_model.parameters())


def test_outer_state_round_trips_for_a_restarted_worker():
    topology = make_topology("ring", 4)
    model = _model(3)
    outer = GASLoCOuter(model.parameters(), topology, 1, 0.7, 0.9, compression="int8")
    outer.round(0, lambda r, peers, wire: {p: wire for p in peers})
    restarted = GASLoCOuter(_model(4).parameters(), topology, 1, 0.7, 0.9, compression="int8")
    restarted.load_state_dict(outer.state_dict())
    for name in ("theta", "z_prev", "residual"):
        assert torch.equal(restarted.state_dict()[name], outer.state_dict()[name])


def test_payload_from_a_non_peer_is_refused():
    step = OuterStep(make_topology("ring", 6), 0, 1.0, 0.0)
    theta = torch.zeros(4)
    with pytest.raises(ValueError, match="not round 0 peers"):
        step.round(0, theta, theta, lambda r, peers, wire: {3: wire})


@pytest.mark.parametrize("compression", ["none", "bf16", "int8"])
def test_screening_sees_decoded_payloads_so_compression_cannot_hide_a_poisoned_update(compression):
    """Worker 0 on a ring of 6 gets an honest update from worker 1 and a x50 one from worker 5, both compressed."""
    dim = 2048
    layout = LayerLayout.from_shapes([("a", (1024,)), ("b", (1024,))])
    screener = UpdateScreener(layout, ScreeningConfig(min_layer_size=16))
    seen = []

    def screen(proposal, decoded):
        seen.append({p: v.dtype for p, v in decoded.items()})
        results = screener.screen_round(decoded, proposal.sent - proposal.theta, anchor=proposal.theta)
        return {p: decoded[p] for p, r in results.items() if r.verdict is not Verdict.REJECT}

    receiver, sender = (OuterStep(make_topology("ring", 6), i, 1.0, 0.0, compression=compression) for i in (0, 1))
    theta = torch.randn(dim, generator=torch.Generator().manual_seed(0))
    moves = torch.randn(3, dim, generator=torch.Generator().manual_seed(1)) * 0.01
    honest = sender.propose(0, theta, theta + moves[1]).wire
    poisoned = with_weight(sender.compressor.codec.encode(theta + 50 * moves[2]), 1.0)
    _, stats = receiver.round(0, theta, theta + moves[0], lambda r, peers, wire: {1: honest, 5: poisoned}, screen)
    assert seen == [{1: torch.float32, 5: torch.float32}]
    assert stats.mixed == (1,) and stats.skipped == (5,)


def _weighted_gossip_round(n, thetas, after, weights, steps, t):
    """Every worker's ``OuterStep.round`` with its weight, payloads handed over in memory."""
    proposals = [steps[i].propose(t, thetas[i], after[i], float(weights[i])) for i in range(n)]
    return [steps[i].finish(proposals[i], {j: proposals[j].wire for j in proposals[i].peers})[0] for i in range(n)]


def test_weighted_gossip_on_the_complete_graph_is_nesterov_sgd_on_the_weighted_mean_pseudo_gradient():
    """Steps done as weights: gossip on the complete graph equals the time-budgeted DiLoCo reference."""
    n, dim, rounds, eta, gamma = 4, 257, 5, 0.7, 0.9
    weights = torch.tensor([3.0, 1.0, 4.0, 2.0])  # within WEIGHT_CAP of each other
    theta0 = torch.randn(dim, generator=torch.Generator().manual_seed(0))
    references = [torch.nn.Parameter(theta0.clone()) for _ in range(2)]  # weighted, and unweighted for contrast
    sgds = [torch.optim.SGD([r], lr=eta, momentum=gamma, nesterov=True) for r in references]
    steps = [OuterStep(make_topology("complete", n), i, eta, gamma) for i in range(n)]
    thetas = [theta0.clone() for _ in range(n)]
    for t in range(rounds):
        after = _inner_steps(thetas, t)
        for reference, sgd, w in zip(references, sgds, (weights, torch.ones(n)), strict=True):
            pseudo = torch.stack([a - reference.detach() for a in after])
            reference.grad = -(w[:, None] * pseudo).sum(0) / w.sum()
            sgd.step()
        thetas = _weighted_gossip_round(n, thetas, after, weights, steps, t)
        for theta in thetas:
            assert torch.allclose(theta, references[0].detach(), atol=1e-5, rtol=0)
    assert not torch.allclose(references[0].detach(), references[1].detach(), atol=1e-2)


def test_weighted_gossip_on_the_ring_mixes_by_steps_and_equal_weights_are_plain_gossip():
    n, dim = 6, 64
    topology = make_topology("ring", n)
    thetas = [torch.randn(dim, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    after = _inner_steps(thetas, 0)
    ys = torch.stack(after)  # eta = 1
    weights = torch.tensor([1.0, 2.0, 4.0, 1.0, 3.0, 1.0])  # within WEIGHT_CAP of each neighbour
    steps = [OuterStep(topology, i, 1.0, 0.0) for i in range(n)]
    mixed = _weighted_gossip_round(n, thetas, after, weights, steps, 0)
    w = topology.mixing_matrix(0).to(torch.float32) * weights[None, :]
    expected = (w / w.sum(1, keepdim=True)) @ ys
    for i in range(n):
        assert torch.allclose(mixed[i], expected[i], atol=1e-5)
    plain = Simulator(topology, outer_lr=1.0, outer_momentum=0.0).round(0, thetas, after)[0]
    fresh = [OuterStep(topology, i, 1.0, 0.0) for i in range(n)]
    equal = _weighted_gossip_round(n, thetas, after, torch.full((n,), 4.0), fresh, 0)
    assert all(torch.equal(a, b) for a, b in zip(plain, equal, strict=True))


def test_a_claimed_weight_is_capped_and_a_bad_one_skips_the_peer():
    topology = make_topology("ring", 6)
    receiver, liar = OuterStep(topology, 0, 1.0, 0.0), OuterStep(topology, 1, 1.0, 0.0)
    theta, own, far = torch.zeros(3), torch.zeros(3), torch.ones(3)
    huge = liar.propose(0, theta, far, weight=1e9).wire
    theta_next, stats = receiver.round(0, theta, own, lambda r, peers, wire: {1: huge}, weight=1.0)
    alpha = topology.metropolis_step(0)
    share = alpha * WEIGHT_CAP / ((1 - alpha) + alpha * WEIGHT_CAP)
    assert stats.mixed == (1,) and torch.allclose(theta_next, torch.full((3,), share))
    for bad in (float("nan"), -1.0, 0.0):
        payload = with_weight(far, 1.0)
        payload[-1] = bad
        _, stats = OuterStep(topology, 0, 1.0, 0.0).round(0, theta, own, lambda r, p, w, x=payload: {1: x})
        assert stats.skipped == (1, 5) and stats.mixed == ()
