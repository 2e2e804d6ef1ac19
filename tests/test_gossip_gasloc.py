"""GASLoC's outer round over the real mTLS gossip transport gives what the simulator gives."""

import threading
from datetime import timedelta

import pytest
import torch

from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.gasloc import GASLoCOuter, Simulator, flatten, make_topology
from cantata.trainer.gossip import GossipNode, gossip_server_name

torch.set_num_threads(1)

JOB = "job-gasloc"


def _models(n):
    torch.manual_seed(0)
    first = torch.nn.Linear(16, 8)
    models = [torch.nn.Linear(16, 8) for _ in range(n)]
    for m in models:
        m.load_state_dict(first.state_dict())
    return models


def _local_steps(model, worker, round):
    """Deterministic stand-in for H inner steps."""
    g = torch.Generator().manual_seed(100 * round + worker)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("compression,dead", [("none", None), ("int8", 2)])
def test_ring_rounds_over_mtls_match_the_simulator(compression, dead):
    n, rounds = 4, 3
    ca = CertificateAuthority.create()
    topology = make_topology("ring", n)
    models = _models(n)
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
            deadline_s=1.0 if dead is not None else 20.0,
        )
        for i in range(n)
    ]
    addresses = {i: node.start() for i, node in enumerate(nodes)}
    if dead is not None:
        nodes[dead].stop()
    outers = [GASLoCOuter(m.parameters(), topology, i, 0.7, 0.9, compression=compression) for i, m in enumerate(models)]
    sim = Simulator(topology, 0.7, 0.9, compression=compression)
    thetas = [flatten(m.parameters()) for m in models]
    stats = {}

    def worker(i, t):
        def exchange(r, peers, wire):
            return nodes[i].exchange(r, {p: addresses[p] for p in peers}, wire)

        stats[i] = outers[i].round(t, exchange)

    try:
        for t in range(rounds):
            live = [i for i in range(n) if i != dead]
            for i in live:
                _local_steps(models[i], i, t)
            afters = [flatten(m.parameters()) for m in models]
            threads = [threading.Thread(target=worker, args=(i, t)) for i in live]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            thetas, sim_stats = sim.round(t, thetas, afters, dead={dead} if dead is not None else set())
            for i in live:
                assert stats[i].mixed == sim_stats[i].mixed
                assert torch.allclose(flatten(models[i].parameters()), thetas[i], atol=1e-6)
    finally:
        for node in nodes:
            node.stop()
    if dead is not None:
        assert stats[1].skipped == (2,) and stats[3].skipped == (2,)
