import math

import pytest
import torch

from cantata.security.anomaly import (
    CenteredClipping,
    WorkerMomentum,
    coordinate_median,
    krum_scores,
    multi_krum,
    trimmed_mean,
)

torch.set_num_threads(1)


def column(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)[:, None]


def test_trimmed_mean_drops_extremes_per_coordinate():
    x = torch.tensor([[1.0, 40.0], [2.0, 10.0], [3.0, 20.0], [100.0, 30.0], [-50.0, 0.0]])
    assert torch.allclose(trimmed_mean(x, 1), torch.tensor([2.0, 20.0]))
    assert torch.allclose(trimmed_mean(x, 0), x.mean(dim=0))


def test_trimmed_mean_drops_a_minority_of_nans():
    x = column(1.0, 2.0, 3.0, math.nan, 5.0)
    assert trimmed_mean(x, 1).item() == pytest.approx(10.0 / 3)


def test_trimmed_mean_needs_rows_left():
    with pytest.raises(ValueError):
        trimmed_mean(column(1.0, 2.0, 3.0, 4.0), 2)


def test_coordinate_median_odd_and_even():
    assert coordinate_median(column(5.0, 1.0, 3.0)).item() == 3.0
    assert coordinate_median(column(5.0, 1.0, 3.0, 100.0)).item() == 4.0
    x = torch.tensor([[1.0, 9.0], [2.0, 8.0], [3.0, 7.0]])
    assert torch.equal(coordinate_median(x), torch.tensor([2.0, 8.0]))


def test_krum_scores_sum_the_n_minus_f_minus_2_nearest_squared_distances():
    x = column(0.0, 1.0, 3.0, 10.0, 11.0)
    # n=5, f=1: the 2 nearest. 0: 1+9; 1: 1+4; 3: 4+9; 10: 1+49; 11: 1+64
    assert krum_scores(x, 1).tolist() == [10.0, 5.0, 13.0, 50.0, 65.0]


def test_krum_and_multi_krum_select_the_lowest_scores():
    x = column(0.0, 1.0, 3.0, 10.0, 11.0)
    assert multi_krum(x, 1).item() == 1.0
    assert multi_krum(x, 1, selected=2).item() == 0.5
    assert multi_krum(x, 1, selected=3).item() == pytest.approx(4 / 3)


def test_krum_never_selects_a_nan_row():
    x = column(0.0, 1.0, 2.0, math.nan, 1.5)
    assert multi_krum(x, 1, selected=4).item() == pytest.approx(4.5 / 4)


def test_krum_needs_n_at_least_2f_plus_3():
    with pytest.raises(ValueError):
        krum_scores(column(0.0, 1.0, 2.0, 3.0), 1)
    with pytest.raises(ValueError):
        multi_krum(column(0.0, 1.0, 2.0, 3.0, 4.0), 1, selected=5)


def test_centered_clipping_hand_computed_and_keeps_its_center():
    aggregator = CenteredClipping(radius=1.0)
    x = torch.tensor([[3.0, 0.0], [0.0, 0.5]])
    # v = 0 + mean(CLIP([3,0], 1), CLIP([0,0.5], 1)) = mean([1,0], [0,0.5])
    assert torch.allclose(aggregator(x), torch.tensor([0.5, 0.25]))
    # next round starts from [0.5, 0.25]: differences [2.5,-0.25] -> clipped, [-0.5, 0.25] kept
    first = torch.tensor([2.5, -0.25])
    expected = torch.tensor([0.5, 0.25]) + (first / first.norm() + torch.tensor([-0.5, 0.25])) / 2
    assert torch.allclose(aggregator(x), expected)


def test_centered_clipping_bounds_a_far_outlier_and_ignores_nan():
    honest = torch.tensor([[1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.0]])
    attacked = torch.cat([honest, torch.tensor([[1e6, -1e6], [math.nan, 0.0]])])
    out = CenteredClipping(radius=None, iterations=5)(attacked)
    assert torch.isfinite(out).all()
    assert (out - honest.mean(dim=0)).norm() < 0.5


def test_worker_momentum_is_an_exponential_average():
    momentum = WorkerMomentum(0.9)
    assert torch.equal(momentum.update(torch.tensor([1.0])), torch.tensor([1.0]))
    assert momentum.update(torch.tensor([2.0])).item() == pytest.approx(0.9 * 1.0 + 0.1 * 2.0)
    with pytest.raises(ValueError):
        WorkerMomentum(1.0)
