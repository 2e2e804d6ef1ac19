import math

import pytest
import torch

from cantata.security.anomaly import (
    LayerLayout,
    ScreeningConfig,
    UpdateScreener,
    Verdict,
    find_opposition,
    make_canary,
    opposition_from_gram,
)
from cantata.security.anomaly.screening import CANARY_SCALE

torch.set_num_threads(1)

LAYOUT = LayerLayout.from_shapes([("big", (128, 128)), ("bias", (64,)), ("small", (32, 32))])


def honest(own: torch.Tensor, generator: torch.Generator, noise: float = 0.5) -> torch.Tensor:
    return own + noise * own.norm() / math.sqrt(own.numel()) * torch.randn(own.shape, generator=generator)


def warmed(screener: UpdateScreener, own: torch.Tensor, generator: torch.Generator, peer: int = 1) -> None:
    for _ in range(screener.config.warmup + 2):
        assert screener.screen(peer, honest(own, generator), own).verdict is Verdict.ACCEPT


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(0)


@pytest.fixture
def own(generator):
    return torch.randn(LAYOUT.size, generator=generator)


def test_layout_from_module_matches_parameters_to_vector():
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    layout = LayerLayout.from_module(module)
    assert layout.names == ("0.weight", "0.bias", "1.weight", "1.bias")
    assert layout.bounds == (0, 12, 16, 24, 26)
    assert layout.size == torch.nn.utils.parameters_to_vector(module.parameters()).numel()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_rejected_and_counted(own, generator, bad):
    screener = UpdateScreener(LAYOUT)
    warmed(screener, own, generator)
    update = honest(own, generator)
    update[[3, 100]] = bad
    result = screener.screen(1, update, own)
    assert result.verdict is Verdict.REJECT
    assert result.scores() == {"finite": 2.0}


def test_honest_updates_are_accepted_after_warm_up(own, generator):
    screener = UpdateScreener(LAYOUT)
    warmed(screener, own, generator)
    results = [screener.screen(1, honest(own, generator), own) for _ in range(30)]
    assert all(r.verdict is Verdict.ACCEPT for r in results)
    assert all(r.clip_norm is None for r in results)


def test_scaled_update_is_rejected_by_the_difference_norm(own, generator):
    screener = UpdateScreener(LAYOUT)
    warmed(screener, own, generator)
    result = screener.screen(1, 10 * honest(own, generator), own)
    checks = {c.check: c for c in result.checks}
    assert checks["difference_norm"].verdict is Verdict.REJECT
    assert checks["difference_norm"].score > screener.config.reject_z
    assert result.verdict is Verdict.REJECT


def test_moderately_large_update_is_clipped_to_the_peers_median_difference(own, generator):
    config = ScreeningConfig(clip_z=2.0, reject_z=50.0, min_relative_spread=0.1)
    screener = UpdateScreener(LAYOUT, config)
    peer_noise = 0.5
    for _ in range(config.warmup + 4):
        screener.screen(1, honest(own, generator, peer_noise), own)
    typical = (honest(own, generator, peer_noise) - own).norm().item()
    result = screener.screen(1, honest(own, generator, 3 * peer_noise), own)
    assert result.verdict is Verdict.CLIP
    assert result.clip_norm == pytest.approx(typical, rel=0.1)


def test_warm_up_uses_the_prior(own, generator):
    config = ScreeningConfig()
    screener = UpdateScreener(LAYOUT, config)
    limit = config.prior_ratio + config.reject_z * config.prior_spread
    far = own + (limit * 1.2) * own.norm() * torch.nn.functional.normalize(
        torch.randn(own.shape, generator=generator), dim=0
    )
    near = honest(own, generator)
    assert screener.screen(1, far, own).verdict is Verdict.REJECT
    assert screener.screen(2, near, own).verdict is Verdict.ACCEPT


def test_rejected_updates_never_enter_the_history(own, generator):
    screener = UpdateScreener(LAYOUT)
    verdicts = [screener.screen(1, 10 * honest(own, generator), own).verdict for _ in range(40)]
    assert verdicts == [Verdict.REJECT] * 40


def test_sign_flipped_update_is_rejected_by_cosine(own, generator):
    screener = UpdateScreener(LAYOUT)
    result = screener.screen(1, -honest(own, generator, 0.2), own)
    checks = {c.check: c for c in result.checks}
    assert checks["cosine"].score < -0.9
    assert checks["cosine"].verdict is Verdict.REJECT
    assert checks["difference_norm"].verdict is Verdict.ACCEPT


def test_cosine_between_thresholds_is_clipped(own, generator):
    screener = UpdateScreener(LAYOUT)
    result = screener.screen(1, with_cosine(own, -0.15, generator), own)
    checks = {c.check: c for c in result.checks}
    assert checks["cosine"].score == pytest.approx(-0.15, abs=1e-4)
    assert checks["cosine"].verdict is Verdict.CLIP
    assert result.verdict is Verdict.CLIP


def with_cosine(own: torch.Tensor, cosine: float, generator: torch.Generator) -> torch.Tensor:
    """A vector as long as ``own`` at the given cosine to it."""
    orthogonal = torch.randn(own.shape, generator=generator)
    orthogonal -= orthogonal @ own / (own @ own) * own
    orthogonal *= own.norm() / orthogonal.norm()
    return cosine * own + math.sqrt(1 - cosine**2) * orthogonal


def test_low_cosine_is_rejected_from_a_new_peer_but_accepted_from_one_that_drifted_there(own, generator):
    screener = UpdateScreener(LAYOUT)
    cold = screener.screen(1, with_cosine(own, -0.25, generator), own)
    assert {c.check: c for c in cold.checks}["cosine"].verdict is Verdict.REJECT
    for cosine in (0.1, 0.0, -0.05, -0.1, -0.15, -0.2):
        assert screener.screen(2, with_cosine(own, cosine, generator), own).verdict is not Verdict.REJECT
    warm = screener.screen(2, with_cosine(own, -0.25, generator), own)
    assert {c.check: c for c in warm.checks}["cosine"].verdict is Verdict.ACCEPT


def test_a_steady_peer_that_turns_against_own_is_rejected(own, generator):
    screener = UpdateScreener(LAYOUT)
    for _ in range(screener.config.warmup + 2):
        assert screener.screen(1, with_cosine(own, 0.4, generator), own).verdict is Verdict.ACCEPT
    flipped = screener.screen(1, with_cosine(own, -0.4, generator), own)
    assert {c.check: c for c in flipped.checks}["cosine"].verdict is Verdict.REJECT


def test_one_poisoned_matrix_is_caught_by_the_layer_check(own, generator):
    screener = UpdateScreener(LAYOUT)
    warmed(screener, own, generator)
    update = honest(own, generator)
    start, stop = LAYOUT.bounds[2], LAYOUT.bounds[3]
    update[start:stop] = own[start:stop] + 8 * (update[start:stop] - own[start:stop])
    result = screener.screen(1, update, own)
    checks = {c.check: c for c in result.checks}
    assert checks["difference_norm"].verdict is not Verdict.REJECT
    assert checks["layer_norms"].verdict is Verdict.REJECT
    assert result.verdict is Verdict.REJECT


def test_layers_below_min_size_are_not_screened_one_by_one(own, generator):
    screener = UpdateScreener(LAYOUT)
    warmed(screener, own, generator)
    update = honest(own, generator)
    start, stop = LAYOUT.bounds[1], LAYOUT.bounds[2]  # the 64-element bias
    update[start:stop] = own[start:stop] + 8 * (update[start:stop] - own[start:stop])
    checks = {c.check: c for c in screener.screen(1, update, own).checks}
    assert checks["layer_norms"].verdict is Verdict.ACCEPT


def test_screen_round_with_anchor_matches_screening_updates(own, generator):
    anchor = torch.randn(LAYOUT.size, generator=generator)
    updates = {peer: honest(own, generator) for peer in (1, 2, 3)}
    updates[3] = -updates[3]
    by_update = UpdateScreener(LAYOUT).screen_round(updates, own)
    by_point = UpdateScreener(LAYOUT).screen_round({p: anchor + u for p, u in updates.items()}, own, anchor=anchor)
    for peer in updates:
        assert by_point[peer].verdict is by_update[peer].verdict
        for a, b in zip(by_point[peer].checks, by_update[peer].checks, strict=True):
            assert a.score == pytest.approx(b.score, rel=1e-3, abs=1e-3)
    assert by_update[3].verdict is Verdict.REJECT


def test_histories_are_kept_per_peer(own, generator):
    screener = UpdateScreener(LAYOUT, ScreeningConfig(clip_z=3.0, reject_z=6.0, min_relative_spread=0.05))
    for _ in range(8):
        screener.screen(1, honest(own, generator, 0.1), own)
        screener.screen(2, honest(own, generator, 1.0), own)
    wide = honest(own, generator, 1.0)
    assert screener.screen(2, wide, own).verdict is Verdict.ACCEPT
    assert screener.screen(1, wide, own).verdict is Verdict.REJECT


def test_mismatched_shapes_and_bad_configs_are_refused(own):
    screener = UpdateScreener(LAYOUT)
    with pytest.raises(ValueError):
        screener.screen(1, own[:-1], own[:-1])
    with pytest.raises(ValueError):
        ScreeningConfig(clip_z=5.0, reject_z=4.0)
    with pytest.raises(ValueError):
        ScreeningConfig(cosine_clip=-0.5, cosine_reject=-0.1)
    with pytest.raises(ValueError):
        UpdateScreener(LAYOUT, ScreeningConfig(min_layer_size=10**6))


def test_a_vector_crafted_from_the_receivers_payload_echoes_its_canary_and_is_rejected(own, generator):
    """Dissensus mirrors the honest neighbour's pull around the receiver's payload: the canary comes back."""
    anchor = torch.randn(LAYOUT.size, generator=generator)
    y = anchor + own
    canary = make_canary(own, CANARY_SCALE, generator)
    sent = y + canary
    neighbour = anchor + honest(own, generator)  # made before it saw the receiver's payload
    mirror = sent - 1.5 * (neighbour - sent)  # dissensus with epsilon 1.5 at equal weights
    screener = UpdateScreener(LAYOUT)
    results = screener.screen_round({1: neighbour, 2: mirror}, own, anchor=anchor, canary=canary)
    assert results[1].verdict is Verdict.ACCEPT
    assert results[1].checks[0].check == "finite"
    assert results[2].verdict is Verdict.REJECT
    assert results[2].checks[0].check == "echo" and results[2].checks[0].score == pytest.approx(2.5, abs=0.3)
    # the same vectors without a canary: the mirror is not told apart by the other checks
    plain = UpdateScreener(LAYOUT).screen_round({1: neighbour, 2: y - 1.5 * (neighbour - y)}, own, anchor=anchor)
    assert plain[2].verdict is not Verdict.REJECT


def test_honest_echoes_stay_far_below_the_threshold(own, generator):
    canary = make_canary(own, CANARY_SCALE, generator)
    assert canary.norm().item() == pytest.approx(CANARY_SCALE * own.norm().item(), rel=1e-4)
    screener = UpdateScreener(LAYOUT)
    for _ in range(30):
        result = screener.screen_round({1: honest(own, generator)}, own, canary=canary)[1]
        assert result.checks[0].check == "finite" and result.verdict is Verdict.ACCEPT
    with pytest.raises(ValueError):
        screener.screen_round({1: own}, own, canary=canary[:-1])
    with pytest.raises(ValueError):
        ScreeningConfig(echo_reject=0.0)


def test_an_echo_within_the_honest_noise_of_a_far_vector_is_left_to_the_other_checks(own, generator):
    """The echo of a vector independent of the canary has spread ||d|| / (sqrt(D) ||canary||): far vectors echo more."""
    canary = make_canary(own, CANARY_SCALE, generator)
    orthogonal = torch.randn(own.shape, generator=generator)
    orthogonal -= torch.dot(orthogonal, canary) / torch.dot(canary, canary) * canary
    far = own + 0.6 * canary + orthogonal * (100 * canary.norm() / orthogonal.norm())  # echo 0.6, noise ~0.76
    near = own + 0.6 * canary + orthogonal * (canary.norm() / orthogonal.norm())  # echo 0.6, noise ~0.008
    results = UpdateScreener(LAYOUT).screen_round({1: far, 2: near}, own, canary=canary)
    assert results[1].checks[0].check == "finite"
    assert results[2].checks[0].check == "echo" and results[2].checks[0].score == pytest.approx(0.6, abs=1e-3)


def test_the_round_gives_the_gram_matrix_of_the_pulls_from_the_receivers_sent_point(own, generator):
    """``pull_gram`` is ``P @ P.T`` for the pulls ``x_j - sent``, and finds the pairs ``find_opposition`` finds."""
    anchor = torch.randn(LAYOUT.size, generator=generator)
    y = anchor + own
    canary = make_canary(own, CANARY_SCALE, generator)
    sent = y + canary
    neighbour = anchor + honest(own, generator)
    received = {
        3: neighbour,
        1: sent - 1.5 * (neighbour - sent),  # a mirror of 3's pull (echoed)
        2: anchor + honest(own, generator),
        7: torch.full_like(own, math.nan),
    }
    results = UpdateScreener(LAYOUT).screen_round(received, own, anchor=anchor, canary=canary)
    pulls = torch.stack([received[p] - sent for p in (2, 3, 1)]).double()
    assert torch.allclose(results.pull_gram([2, 3, 1]), pulls @ pulls.T, rtol=1e-4, atol=1e-3 * own.norm().item())
    assert not math.isfinite(results.pull_gram([7])[0, 0].item())
    peers = [2, 3, 1, 7]
    from_gram = opposition_from_gram(peers, results.pull_gram(peers))
    explicit = find_opposition({p: received[p] - sent for p in peers})
    assert from_gram.pairs == explicit.pairs == ((3, 1),)
    assert from_gram.caps == pytest.approx(explicit.caps, rel=1e-4)
    with pytest.raises(ValueError):
        opposition_from_gram(peers, results.pull_gram(peers[:3]))


def test_a_far_off_peer_in_grace_is_clipped_to_its_typical_norm_and_the_history_follows_it_in_bounded_steps(
    own, generator
):
    """A peer that lagged (in grace: ``lenient``) and drifted past its history is clipped, not rejected, and
    once its capped ratios fill the window its new distance is normal again; without grace it stays rejected."""
    config = ScreeningConfig()
    lenient, strict = UpdateScreener(LAYOUT, config), UpdateScreener(LAYOUT, config)
    for screener in (lenient, strict):
        warmed(screener, own, generator)
    typical = (honest(own, generator) - own).norm().item()
    drifted = [honest(own, generator, 4.0) for _ in range(config.window)]
    first = lenient.screen_round({1: drifted[0]}, own, lenient=frozenset({1}))[1]
    assert first.verdict is Verdict.CLIP and {c.check: c.verdict for c in first.checks}["difference_norm"] is (
        Verdict.CLIP
    )
    assert first.clip_norm == pytest.approx(typical, rel=0.2)  # mixed at its old typical distance, no further
    for update in drifted[1:]:
        assert lenient.screen_round({1: update}, own, lenient=frozenset({1}))[1].verdict is not Verdict.REJECT
        assert strict.screen(1, update, own).verdict is Verdict.REJECT  # never in grace: never re-baselined
    assert lenient.screen(1, honest(own, generator, 4.0), own).verdict is not Verdict.REJECT  # grace is over


def test_grace_spares_only_the_distance_a_flipped_or_poisoned_update_in_grace_is_rejected(own, generator):
    screener = UpdateScreener(LAYOUT)
    warmed(screener, own, generator)
    flipped = screener.screen_round({1: -10 * honest(own, generator, 0.2)}, own, lenient=frozenset({1}))[1]
    assert flipped.verdict is Verdict.REJECT
    assert {c.check: c.verdict for c in flipped.checks}["cosine"] is Verdict.REJECT
    poisoned = honest(own, generator)
    start, stop = LAYOUT.bounds[2], LAYOUT.bounds[3]  # one matrix, far off
    poisoned[start:stop] = own[start:stop] + 8 * (poisoned[start:stop] - own[start:stop])
    result = screener.screen_round({1: poisoned}, own, lenient=frozenset({1}))[1]
    assert result.verdict is Verdict.REJECT and result.checks[-1].verdict is Verdict.REJECT  # layer_norms
