import math

import pytest
import torch

from cantata.security.anomaly import clipped_gossip, find_opposition
from cantata.security.anomaly.clipping import AdaptiveRadius

torch.set_num_threads(1)


def _pulls(seed: int, dim: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A receiver's deviation and two honest neighbours' pulls, which share it."""
    g = torch.Generator().manual_seed(seed)
    deviation, a, b = (torch.randn(dim, generator=g) for _ in range(3))
    return deviation, a - deviation, b - deviation


def test_honest_pulls_are_not_opposed():
    for seed in range(20):
        _, a, b = _pulls(seed)
        opposition = find_opposition({1: a, 2: b})
        assert opposition.pairs == () and dict(opposition.caps) == {}


def test_a_mirror_is_paired_with_the_pull_it_cancels_and_both_are_capped_to_the_nearer():
    _, honest, _ = _pulls(0)
    mirror = -1.5 * honest  # dissensus, epsilon 1.5 at equal weights, on a ring receiver's two neighbours
    opposition = find_opposition({1: honest, 2: mirror})
    assert opposition.pairs == ((1, 2),)
    assert opposition.caps[1] == pytest.approx(honest.norm().item())
    assert opposition.caps[2] == pytest.approx(honest.norm().item())
    y = torch.zeros_like(honest)
    rule = AdaptiveRadius(0)
    undefended = clipped_gossip(y, [honest, mirror], [1.0, 1.0], 1 / 3, rule)
    capped = clipped_gossip(y, [honest, mirror], [1.0, 1.0], 1 / 3, rule, [opposition.caps[1], opposition.caps[2]])
    assert torch.dot(undefended, honest) < 0  # mixed plainly, the mirror pushes the receiver away
    assert capped.norm() < 1e-5 * honest.norm()  # capped, the pair cancels


def test_a_pair_is_kept_whole_and_a_non_finite_pull_is_left_to_the_screening():
    _, honest, _ = _pulls(1)
    other = torch.randn(honest.shape, generator=torch.Generator().manual_seed(9))  # unrelated to both
    opposition = find_opposition({1: honest, 2: -honest, 3: other, 4: torch.full_like(honest, math.nan)})
    assert opposition.pairs == ((1, 2),)
    assert opposition.whole_pairs({1, 3, 4}) == {3, 4}  # 2 rejected by the screening: 1 goes too
    assert opposition.whole_pairs({1, 2, 3}) == {1, 2, 3}
    with pytest.raises(ValueError):
        find_opposition({1: honest}, threshold=-2.0)
