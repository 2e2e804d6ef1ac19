import math

import pytest
import torch

from cantata.security.anomaly import AdaptiveRadius, FixedRadius, clip, clipped_gossip

torch.set_num_threads(1)


def test_clip_shrinks_long_vectors_to_the_radius():
    v = torch.tensor([3.0, 4.0])
    assert torch.allclose(clip(v, 2.5), torch.tensor([1.5, 2.0]))
    assert clip(v, 2.5).norm().item() == pytest.approx(2.5)


def test_clip_leaves_short_and_zero_vectors_alone():
    v = torch.tensor([3.0, 4.0])
    assert torch.equal(clip(v, 5.0), v)
    assert torch.equal(clip(v, 10.0), v)
    assert torch.equal(clip(torch.zeros(3), 0.0), torch.zeros(3))


def test_clip_zeroes_vectors_without_a_finite_norm():
    assert torch.equal(clip(torch.tensor([1.0, math.nan]), 1.0), torch.zeros(2))
    assert torch.equal(clip(torch.tensor([math.inf, 0.0]), 1.0), torch.zeros(2))


def test_clip_refuses_a_negative_radius():
    with pytest.raises(ValueError):
        clip(torch.ones(2), -1.0)


@pytest.mark.parametrize(("byzantine", "expected"), [(0, 5.0), (1, 3.0), (2, 1.0), (5, 1.0)])
def test_adaptive_radius_is_the_b_plus_first_largest_distance(byzantine, expected):
    distances = torch.tensor([1.0, 5.0, 3.0])
    assert AdaptiveRadius(byzantine).radius(distances) == expected


def test_clipped_gossip_hand_computed():
    own = torch.tensor([0.0, 0.0])
    neighbours = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 10.0])]
    # z = own - step * sum_j lambda_j * CLIP(own - y_j, tau)
    fixed = clipped_gossip(own, neighbours, [1.0, 1.0], 0.5, FixedRadius(2.0))
    assert torch.allclose(fixed, torch.tensor([0.5, 1.0]))
    adaptive = clipped_gossip(own, neighbours, [1.0, 1.0], 0.5, AdaptiveRadius(1))  # tau = 1
    assert torch.allclose(adaptive, torch.tensor([0.5, 0.5]))
    weighted = clipped_gossip(own, neighbours, [2.0, 1.0], 0.25, FixedRadius(2.0))
    assert torch.allclose(weighted, torch.tensor([0.5, 0.5]))


def test_infinite_radius_is_plain_gossip():
    generator = torch.Generator().manual_seed(1)
    own = torch.randn(6, generator=generator)
    neighbours = [torch.randn(6, generator=generator) for _ in range(3)]
    weights = [1.0, 0.5, 2.0]
    plain = own + 0.2 * sum(w * (n - own) for w, n in zip(weights, neighbours, strict=True))
    assert torch.allclose(clipped_gossip(own, neighbours, weights, 0.2, FixedRadius(math.inf)), plain)


def test_caps_lower_one_neighbours_radius():
    own = torch.tensor([0.0, 0.0])
    neighbours = [torch.tensor([4.0, 0.0]), torch.tensor([0.0, 4.0])]
    z = clipped_gossip(own, neighbours, [1.0, 1.0], 0.5, FixedRadius(2.0), caps=[None, 1.0])
    assert torch.allclose(z, torch.tensor([1.0, 0.5]))


def test_a_far_byzantine_neighbour_moves_a_worker_by_at_most_step_times_tau():
    own = torch.zeros(4)
    honest = [torch.full((4,), 0.1), torch.full((4,), -0.1)]
    attacker = torch.full((4,), 1e6)
    z = clipped_gossip(own, honest + [attacker], [1.0] * 3, 1 / 4, AdaptiveRadius(1))
    tau = torch.full((4,), 0.1).norm().item()
    assert (z - own).norm().item() <= 1 / 4 * tau + 1e-6


def test_no_neighbours_leaves_own_value_and_lengths_must_match():
    own = torch.ones(3)
    assert torch.equal(clipped_gossip(own, [], [], 0.5, AdaptiveRadius()), own)
    with pytest.raises(ValueError):
        clipped_gossip(own, [own], [1.0, 1.0], 0.5, AdaptiveRadius())
    with pytest.raises(ValueError):
        FixedRadius(-1.0)
