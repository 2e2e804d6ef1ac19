"""ClippedGossip: gossip mixing with clipped differences (He, Karimireddy, Jaggi 2022).

Worker i mixes its proposed point with its neighbours' as

    z_i = y_i - alpha * sum_j lambda_ij * CLIP(y_i - y_j, tau_i),
    CLIP(v, tau) = v * min(1, tau / ||v||),

so one neighbour can move y_i by at most ``alpha * lambda_ij * tau_i`` however
far away it claims to be. Without clipping (tau = inf) this is plain gossip.

The radius is selectable: a fixed ``tau``, or ClippedGossip's adaptive rule,
which takes the (b+1)-th largest neighbour distance (b = the number of
Byzantine neighbours tolerated, 1 by default: the second-largest distance),
so the b farthest neighbours are pulled in to the distance of the next one.
A screening verdict of CLIP lowers one neighbour's radius further.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def clip(vector: torch.Tensor, radius: float) -> torch.Tensor:
    """``vector * min(1, radius / ||vector||)``.

    A zero vector stays zero; a vector without a finite norm (NaN or Inf
    entries) carries no usable direction and becomes zero.
    """
    if radius < 0:
        raise ValueError(f"clip radius must be >= 0, got {radius}")
    norm = vector.norm().item()
    if not math.isfinite(norm):
        return torch.zeros_like(vector)
    if norm <= radius:
        return vector
    return vector * (radius / norm)


@dataclass(frozen=True)
class FixedRadius:
    """The same radius ``tau`` every round."""

    tau: float

    def __post_init__(self) -> None:
        if self.tau < 0:
            raise ValueError(f"tau must be >= 0, got {self.tau}")

    def radius(self, distances: torch.Tensor) -> float:
        return self.tau


@dataclass(frozen=True)
class AdaptiveRadius:
    """ClippedGossip's adaptive radius: the (b+1)-th largest neighbour distance."""

    byzantine_neighbours: int = 1

    def __post_init__(self) -> None:
        if self.byzantine_neighbours < 0:
            raise ValueError("byzantine_neighbours must be >= 0")

    def radius(self, distances: torch.Tensor) -> float:
        """With no more than b neighbours, the smallest distance."""
        if distances.numel() == 0:
            return 0.0
        ordered = distances.sort(descending=True).values
        return ordered[min(self.byzantine_neighbours, ordered.numel() - 1)].item()


ClipRule = FixedRadius | AdaptiveRadius


def clipped_gossip(
    own: torch.Tensor,
    neighbours: Sequence[torch.Tensor],
    edge_weights: Sequence[float],
    step: float,
    rule: ClipRule,
    caps: Sequence[float | None] | None = None,
) -> torch.Tensor:
    """One worker's ClippedGossip mix ``z_i`` of its ``own`` point with its neighbours'.

    ``edge_weights`` are the Laplacian weights ``lambda_ij`` and ``step`` is
    ``alpha``. ``caps`` (one per neighbour, None for no cap) lower a
    neighbour's radius below ``tau_i``, as a screening CLIP verdict asks.
    Rejected or quarantined neighbours are simply left out by the caller,
    which gives their weight to self.
    """
    if len(neighbours) != len(edge_weights) or (caps is not None and len(caps) != len(neighbours)):
        raise ValueError("neighbours, edge_weights and caps must have one entry per neighbour")
    if not neighbours:
        return own.clone()
    differences = [own - neighbour for neighbour in neighbours]
    tau = rule.radius(torch.stack([d.norm() for d in differences]))
    caps = caps if caps is not None else [None] * len(neighbours)
    pull = torch.zeros_like(own)
    for difference, weight, cap in zip(differences, edge_weights, caps, strict=True):
        radius = tau if cap is None else min(tau, cap)
        pull.add_(clip(difference, radius), alpha=weight)
    return own - step * pull
