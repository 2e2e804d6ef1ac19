"""Gradient buckets laid out as Megatron lays them out.

Parameters are taken in reverse model order (the order backward produces
their gradients); a bucket closes as soon as it holds at least `bucket_elements`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """Indices of the parameters in a bucket (in bucket order) and their element counts."""

    params: tuple[int, ...]
    numels: tuple[int, ...]

    @property
    def numel(self) -> int:
        return sum(self.numels)


def build_buckets(numels: Sequence[int], bucket_elements: int) -> list[Bucket]:
    """Group parameters (given by element count, in model order) into reverse-order buckets."""
    if bucket_elements <= 0:
        raise ValueError(f"bucket_elements must be positive, got {bucket_elements}")
    buckets: list[Bucket] = []
    params: list[int] = []
    sizes: list[int] = []
    for index in reversed(range(len(numels))):
        params.append(index)
        sizes.append(numels[index])
        if sum(sizes) >= bucket_elements:
            buckets.append(Bucket(tuple(params), tuple(sizes)))
            params, sizes = [], []
    if params:
        buckets.append(Bucket(tuple(params), tuple(sizes)))
    return buckets
