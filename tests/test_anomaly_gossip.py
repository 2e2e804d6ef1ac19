"""Screening, quarantine and ClippedGossip together on a small decentralized problem.

Eight workers on a ring solve a least-squares problem with local steps and
gossip; worker 0 attacks. Screened, it is quarantined by both its neighbours,
the honest workers end as near their data's optimum as they do when worker 0
never joined (the best a defence can do), and the events the server would
audit are there.
"""

import pytest
import torch

from cantata.security.anomaly import (
    AdaptiveRadius,
    AnomalyKind,
    AttackConfig,
    AttackKind,
    LayerLayout,
    Quarantine,
    QuarantinePolicy,
    ScreeningConfig,
    UpdateScreener,
    Verdict,
    clipped_gossip,
)
from cantata.trainer.attacks import AttackView, craft

torch.set_num_threads(1)

N, DIM, ROUNDS, LOCAL_STEPS, LR, STEP = 8, 64, 40, 5, 0.05, 1 / 3
LAYOUT = LayerLayout.from_shapes([("w1", (32,)), ("w2", (32,))])


def problem():
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(DIM, generator=generator)
    features = torch.randn(N, 128, DIM, generator=generator)
    labels = features @ target + 0.1 * torch.randn(N, 128, generator=generator)
    return target, features, labels


def run(attack: AttackConfig | None, screened: bool, absent: frozenset[int] = frozenset()):
    """Final mean squared distance of honest workers to their data's optimum, events, quarantines.

    ``absent`` workers are cut out of the ring, as if they had never joined.
    """
    _, features, labels = problem()
    theta = torch.zeros(N, DIM)
    screeners = {i: UpdateScreener(LAYOUT, ScreeningConfig(min_layer_size=16)) for i in range(N)}
    quarantines = {i: Quarantine(i, QuarantinePolicy(rejections=3, window=10)) for i in range(N)}
    events = []
    byzantine = (attack.workers if attack else frozenset()) | absent
    for round in range(ROUNDS):
        local = theta.clone()
        for _ in range(LOCAL_STEPS):
            residual = torch.einsum("nmd,nd->nm", features, local) - labels
            local -= LR * torch.einsum("nmd,nm->nd", features, residual) / features.shape[1]
        y = local  # eta = 1: y = theta + (local - theta)
        z = y.clone()
        for i in range(N):
            if i in byzantine:
                continue
            neighbours = [j for j in ((i - 1) % N, (i + 1) % N) if j not in absent]
            messages = {}
            for j in neighbours:
                messages[j] = y[j]
                if attack and attack.attacks(j, round):
                    view = AttackView(y[j] - theta[j], y[[i]] - theta[j], y[i] - theta[j], torch.ones(1), STEP, N, 1)
                    messages[j] = theta[j] + craft(attack, view, torch.Generator())
            if not screened:
                z[i] = y[i] + STEP * sum(m - y[i] for m in messages.values())
                continue
            open_peers = {j: m for j, m in messages.items() if not quarantines[i].is_quarantined(j)}
            results = screeners[i].screen_round(open_peers, y[i] - theta[i], anchor=theta[i])
            kept, caps = [], []
            for j, result in results.items():
                events += quarantines[i].record(round, result)
                if result.verdict is not Verdict.REJECT:
                    kept.append(open_peers[j])
                    caps.append(result.clip_norm)
            z[i] = clipped_gossip(y[i], kept, [1.0] * len(kept), STEP, AdaptiveRadius(1), caps)
        theta = z
    honest = [i for i in range(N) if i not in byzantine]
    optimum = torch.linalg.lstsq(features[honest].reshape(-1, DIM), labels[honest].reshape(-1)).solution
    error = (theta[honest] - optimum).square().sum(dim=1).mean().item()
    return error, events, quarantines


def test_sign_flip_worker_is_quarantined_and_honest_workers_reach_near_clean_error():
    _, clean_events, _ = run(None, screened=True)
    assert clean_events == []
    without_worker_0, _, _ = run(None, screened=True, absent=frozenset({0}))
    attack = AttackConfig(AttackKind.SIGN_FLIP, frozenset({0}))
    undefended_error, _, _ = run(attack, screened=False)
    error, events, quarantines = run(attack, screened=True)

    assert quarantines[1].is_quarantined(0) and quarantines[7].is_quarantined(0)
    assert not any(q.quarantined - {0} for q in quarantines.values())
    quarantined = [e for e in events if e.kind is AnomalyKind.PEER_QUARANTINED]
    assert sorted((e.worker, e.peer) for e in quarantined) == [(1, 0), (7, 0)]
    assert all(e.peer == 0 and e.scores["cosine"] < 0 for e in events)
    assert error <= 1.05 * without_worker_0
    assert undefended_error > 20 * error


@pytest.mark.parametrize("kind", [AttackKind.NAN, AttackKind.SCALE])
def test_nan_and_scaled_workers_never_reach_honest_models(kind):
    without_worker_0, _, _ = run(None, screened=True, absent=frozenset({0}))
    error, events, quarantines = run(AttackConfig(kind, frozenset({0})), screened=True)
    assert error <= 1.05 * without_worker_0
    assert quarantines[1].is_quarantined(0) and quarantines[7].is_quarantined(0)
    assert {e.peer for e in events} == {0}
    assert all(e.scores["finite"] == (DIM if kind is AttackKind.NAN else 0) for e in events)
