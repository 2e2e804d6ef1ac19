"""Static ownership plans: which data-parallel rank runs each matrix's update.

Every plan assigns whole parameters to ranks (no matrix is ever split). The
plans are pure functions of shapes and the world size, so every rank computes
the same plan with no communication.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from .buckets import Bucket


@dataclass(frozen=True)
class ShardingPlan:
    """Owner rank of every parameter, bucket by bucket (owners[b][j] owns buckets[b].params[j])."""

    name: str
    world_size: int
    buckets: tuple[Bucket, ...]
    owners: tuple[tuple[int, ...], ...]

    def owner_by_param(self) -> dict[int, int]:
        return {
            param: owner
            for bucket, owners in zip(self.buckets, self.owners, strict=True)
            for param, owner in zip(bucket.params, owners, strict=True)
        }

    def rank_costs(self, costs: Sequence[float]) -> list[float]:
        """Total update cost each rank carries."""
        loads = [0.0] * self.world_size
        for param, owner in self.owner_by_param().items():
            loads[owner] += costs[param]
        return loads

    def rank_elements(self) -> list[int]:
        """Elements each rank owns (its slice of the reduce-scatter and all-gather)."""
        elements = [0] * self.world_size
        for bucket, owners in zip(self.buckets, self.owners, strict=True):
            for numel, owner in zip(bucket.numels, owners, strict=True):
                elements[owner] += numel
        return elements

    def padded_elements(self) -> int:
        """Elements moved by padded collectives: world_size times the largest slice, per bucket."""
        total = 0
        for bucket, owners in zip(self.buckets, self.owners, strict=True):
            slices = [0] * self.world_size
            for numel, owner in zip(bucket.numels, owners, strict=True):
                slices[owner] += numel
            total += self.world_size * max(slices)
        return total


def max_over_mean(loads: Sequence[float]) -> float:
    """Imbalance of per-rank loads (1.0 is perfect balance)."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


def start_point_plan(buckets: Sequence[Bucket], world_size: int) -> ShardingPlan:
    """Each parameter goes to the rank whose even ZeRO range of its bucket holds its first element."""
    _check_world_size(world_size)
    owners = []
    for bucket in buckets:
        starts = _starts(bucket)
        owners.append(tuple(min(world_size - 1, start * world_size // bucket.numel) for start in starts))
    return ShardingPlan("start-point", world_size, tuple(buckets), tuple(owners))


def alpha_targets_plan(
    buckets: Sequence[Bucket], costs: Sequence[float], world_size: int, alpha: float
) -> ShardingPlan:
    """Canzona's alpha-targeted cuts, before the comparison with the start-point plan.

    Buckets are visited largest first. A rank's target slice of a bucket is
    (1 - alpha) * even + alpha * (its share of the remaining cost deficit);
    cuts snap to the parameter boundary nearest each cumulative target.
    alpha = 0 balances communication, alpha = 1 balances compute.
    """
    _check_world_size(world_size)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    goal = sum(costs[p] for bucket in buckets for p in bucket.params) / world_size
    loads = [0.0] * world_size
    owners: list[tuple[int, ...]] = [()] * len(buckets)
    for index in sorted(range(len(buckets)), key=lambda b: -buckets[b].numel):
        bucket = buckets[index]
        deficits = [max(0.0, goal - load) for load in loads]
        total_deficit = sum(deficits)
        even = bucket.numel / world_size
        targets = [
            (1 - alpha) * even + alpha * (d / total_deficit * bucket.numel if total_deficit > 0 else even)
            for d in deficits
        ]
        owners[index] = _snap_to_boundaries(bucket, targets)
        for param, owner in zip(bucket.params, owners[index], strict=True):
            loads[owner] += costs[param]
    return ShardingPlan(f"alpha={alpha:g}", world_size, tuple(buckets), tuple(owners))


def alpha_balanced_plan(
    buckets: Sequence[Bucket], costs: Sequence[float], world_size: int, alpha: float
) -> ShardingPlan:
    """The alpha-targeted plan if its max/mean cost beats the start-point plan's, else the start-point plan."""
    targeted = alpha_targets_plan(buckets, costs, world_size, alpha)
    start_point = start_point_plan(buckets, world_size)
    if max_over_mean(targeted.rank_costs(costs)) < max_over_mean(start_point.rank_costs(costs)):
        return targeted
    return ShardingPlan(targeted.name, world_size, start_point.buckets, start_point.owners)


def layerwise_pingpong_plan(buckets: Sequence[Bucket], world_size: int) -> ShardingPlan:
    """NVIDIA's layer-wise baseline: parameters by size, largest first, dealt out 0..D-1, D-1..0, ..."""
    _check_world_size(world_size)
    numel_of = {p: n for bucket in buckets for p, n in zip(bucket.params, bucket.numels, strict=True)}
    order = sorted(numel_of, key=lambda p: (-numel_of[p], p))
    owner_of = {}
    for position, param in enumerate(order):
        lap, offset = divmod(position, world_size)
        owner_of[param] = offset if lap % 2 == 0 else world_size - 1 - offset
    owners = tuple(tuple(owner_of[p] for p in bucket.params) for bucket in buckets)
    return ShardingPlan("layer-wise", world_size, tuple(buckets), owners)


def ideal_lpt_loads(costs: Sequence[float], world_size: int) -> list[float]:
    """Per-rank loads of longest-processing-time-first packing with no locality constraint."""
    _check_world_size(world_size)
    heap = [(0.0, rank) for rank in range(world_size)]
    for cost in sorted(costs, reverse=True):
        load, rank = heapq.heappop(heap)
        heapq.heappush(heap, (load + cost, rank))
    loads = [0.0] * world_size
    for load, rank in heap:
        loads[rank] = load
    return loads


def _starts(bucket: Bucket) -> list[int]:
    starts, offset = [], 0
    for numel in bucket.numels:
        starts.append(offset)
        offset += numel
    return starts


def _snap_to_boundaries(bucket: Bucket, targets: Sequence[float]) -> tuple[int, ...]:
    """Owner of each parameter when rank r's cut is the boundary nearest the cumulative target."""
    boundaries = _starts(bucket) + [bucket.numel]
    cuts: list[int] = []
    cumulative = 0.0
    for target in targets[:-1]:
        cumulative += target
        right = bisect.bisect_left(boundaries, cumulative)
        candidates = boundaries[max(0, right - 1) : right + 1]
        nearest = min(candidates, key=lambda b: (abs(b - cumulative), b))
        cuts.append(max(nearest, cuts[-1] if cuts else 0))
    return tuple(bisect.bisect_right(cuts, start) for start in _starts(bucket))


def _check_world_size(world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
