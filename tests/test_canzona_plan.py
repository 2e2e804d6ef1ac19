"""Canzona's planning: buckets, ownership plans, cost models and TP micro-groups (pure computation)."""

from __future__ import annotations

import itertools
import random

import pytest

from cantata.trainer.optim.buckets import build_buckets
from cantata.trainer.optim.cost import newton_schulz_flops, soap_flops
from cantata.trainer.optim.partition import (
    alpha_balanced_plan,
    alpha_targets_plan,
    ideal_lpt_loads,
    layerwise_pingpong_plan,
    max_over_mean,
    start_point_plan,
)
from cantata.trainer.optim.qwen3 import qwen3_matrix_shapes
from cantata.trainer.optim.tp import greedy_rollback_groups, lpt_pack

BUCKET = 400_000_000


def qwen3(model: str):
    shapes = qwen3_matrix_shapes(model)
    numels = [rows * cols for rows, cols in shapes]
    costs = [newton_schulz_flops(shape) for shape in shapes]
    return build_buckets(numels, BUCKET), costs


def random_workload(seed: int):
    rng = random.Random(seed)
    shapes = [(rng.choice([64, 128, 256, 512]), rng.choice([64, 128, 384])) for _ in range(rng.randint(10, 60))]
    numels = [r * c for r, c in shapes]
    return build_buckets(numels, rng.choice([20_000, 100_000, 400_000])), [newton_schulz_flops(s) for s in shapes]


def test_buckets_take_parameters_in_reverse_and_close_at_the_threshold():
    buckets = build_buckets([5, 5, 5, 5, 7], bucket_elements=10)
    assert [b.params for b in buckets] == [(4, 3), (2, 1), (0,)]
    assert [b.numel for b in buckets] == [12, 10, 5]


def test_cost_models():
    assert newton_schulz_flops((4096, 12288)) == 5 * 4 * 12288 * 4096**2
    assert newton_schulz_flops((12288, 4096)) == newton_schulz_flops((4096, 12288))
    assert soap_flops((100, 100), precondition_frequency=10) == pytest.approx(4 * 100**3 + 7.3 * 2 * 100**3 / 10)


@pytest.mark.parametrize("model", ["8B", "32B"])
def test_alpha_one_balances_qwen3_within_five_percent_at_eight_ranks(model):
    buckets, costs = qwen3(model)
    plan = alpha_balanced_plan(buckets, costs, 8, alpha=1.0)
    assert max_over_mean(plan.rank_costs(costs)) <= 1.05
    assert max_over_mean(start_point_plan(buckets, 8).rank_costs(costs)) > 1.6


def test_start_point_and_alpha_zero_reproduce_the_reference_simulation_on_qwen3_8b():
    buckets, costs = qwen3("8B")
    assert max_over_mean(start_point_plan(buckets, 8).rank_costs(costs)) == pytest.approx(1.69, abs=0.01)
    assert max_over_mean(alpha_targets_plan(buckets, costs, 8, 0.0).rank_costs(costs)) == pytest.approx(1.51, abs=0.01)


def test_alpha_zero_minimizes_padded_communication_and_alpha_one_compute():
    buckets, costs = qwen3("32B")
    low, high = (alpha_targets_plan(buckets, costs, 4, a) for a in (0.0, 1.0))
    assert low.padded_elements() < high.padded_elements()
    assert max_over_mean(high.rank_costs(costs)) < max_over_mean(low.rank_costs(costs))


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_plans_own_whole_matrices_in_contiguous_slices_and_never_lose_to_start_point(seed, world_size):
    buckets, costs = random_workload(seed)
    start = start_point_plan(buckets, world_size)
    for alpha in (0.0, 0.5, 1.0):
        plan = alpha_balanced_plan(buckets, costs, world_size, alpha)
        assert sorted(plan.owner_by_param()) == list(range(len(costs)))
        for owners in plan.owners:
            assert list(owners) == sorted(owners) and all(0 <= o < world_size for o in owners)
        assert max_over_mean(plan.rank_costs(costs)) <= max_over_mean(start.rank_costs(costs))
        assert max(plan.rank_costs(costs)) >= max(max(costs), sum(costs) / world_size) * (1 - 1e-12)
        assert plan.padded_elements() >= sum(b.numel for b in buckets)


def test_layerwise_pingpong_deals_equal_matrices_evenly():
    buckets = build_buckets([100] * 8 + [10] * 8, bucket_elements=10**9)
    plan = layerwise_pingpong_plan(buckets, 4)
    assert plan.rank_elements() == [220] * 4


def test_ideal_lpt_packs_greedily_largest_first():
    assert sorted(ideal_lpt_loads([7, 5, 4, 3, 3], 2)) == [10, 12]


def test_greedy_rollback_groups_respect_capacity_and_cover_every_matrix_once():
    rng = random.Random(3)
    costs = [rng.uniform(1, 10) for _ in range(40)]
    capacity = max(costs) * 1.5
    groups = greedy_rollback_groups(costs, slots=4, capacity=capacity)
    assert sorted(i for g in groups for i in g.items) == list(range(40))
    order = [i for g in groups for i in g.items]
    assert [costs[i] for i in order] == sorted(costs, reverse=True)
    for group, following in itertools.pairwise(groups):
        hosts, loads = lpt_pack([costs[i] for i in group.items], 4)
        assert max(loads) <= capacity and list(group.hosts) == hosts
        _, with_next = lpt_pack([costs[i] for i in group.items + following.items[:1]], 4)
        assert max(with_next) > capacity


def test_greedy_rollback_capacity_must_hold_the_largest_matrix():
    with pytest.raises(ValueError, match="below the largest"):
        greedy_rollback_groups([5.0, 9.0], slots=2, capacity=8.0)
