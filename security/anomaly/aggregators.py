"""Robust aggregators for the complete graph (all-reduce / DiLoCo contributions).

Each takes the ``n`` contributions as the rows of an ``[n, d]`` tensor and
returns one ``d`` vector, following its paper:

- trimmed mean (Yin et al., ICML 2018): per coordinate, drop the ``b``
  largest and ``b`` smallest values and average the rest;
- coordinate-wise median (same paper);
- Krum and Multi-Krum (Blanchard et al., NeurIPS 2017; El Mhamdi et al.,
  ICML 2018): score_i = sum of squared distances to the ``n - f - 2`` nearest
  other rows; Krum returns the row of lowest score, Multi-Krum the mean of the
  ``m`` lowest;
- centered clipping with worker momentum (Karimireddy, He, Jaggi, ICML 2021):
  honest workers send ``m_i = (1 - beta) g_i + beta m_i``; the aggregator
  iterates ``v <- v + (1/n) sum_i CLIP(m_i - v, tau)`` from its previous output.

Non-finite rows are handled as the formulas imply when NaN counts as the
largest value: sorting puts NaN last, so trimming and the median drop a
minority of them; a Krum score involving NaN is infinite; CLIP of a vector
without a finite norm is zero.
"""

from __future__ import annotations

import torch

from .clipping import clip


def _rows(vectors: torch.Tensor) -> torch.Tensor:
    if vectors.dim() != 2 or vectors.shape[0] == 0:
        raise ValueError(f"expected an [n, d] tensor with n >= 1, got shape {tuple(vectors.shape)}")
    return vectors


def trimmed_mean(vectors: torch.Tensor, trim: int) -> torch.Tensor:
    """Coordinate-wise mean after dropping the ``trim`` largest and smallest values."""
    n = _rows(vectors).shape[0]
    if trim < 0 or 2 * trim >= n:
        raise ValueError(f"trim must satisfy 0 <= 2*trim < n={n}, got {trim}")
    ordered = vectors.sort(dim=0).values
    return ordered[trim : n - trim].mean(dim=0)


def coordinate_median(vectors: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median; the mean of the two middle values when ``n`` is even."""
    n = _rows(vectors).shape[0]
    ordered = vectors.sort(dim=0).values
    return ordered[(n - 1) // 2 : n // 2 + 1].mean(dim=0)


def krum_scores(vectors: torch.Tensor, byzantine: int) -> torch.Tensor:
    """Each row's sum of squared distances to its ``n - f - 2`` nearest other rows."""
    n = _rows(vectors).shape[0]
    if byzantine < 0 or n < 2 * byzantine + 3:
        raise ValueError(f"Krum needs n >= 2f + 3, got n={n}, f={byzantine}")
    squared = torch.cdist(vectors.to(torch.float64), vectors.to(torch.float64)).square()
    squared = torch.nan_to_num(squared, nan=torch.inf)
    squared.fill_diagonal_(torch.inf)
    nearest = squared.sort(dim=1).values[:, : n - byzantine - 2]
    return nearest.sum(dim=1)


def multi_krum(vectors: torch.Tensor, byzantine: int, selected: int = 1) -> torch.Tensor:
    """The mean of the ``selected`` rows of lowest Krum score (``selected=1`` is Krum)."""
    n = _rows(vectors).shape[0]
    if not 1 <= selected <= n - byzantine:
        raise ValueError(f"selected must be in 1..n-f={n - byzantine}, got {selected}")
    chosen = krum_scores(vectors, byzantine).argsort()[:selected]
    return vectors[chosen].mean(dim=0)


class WorkerMomentum:
    """An honest worker's momentum ``m = (1 - beta) * g + beta * m``, starting from ``m = g``."""

    def __init__(self, beta: float):
        if not 0 <= beta < 1:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = beta
        self.momentum: torch.Tensor | None = None

    def update(self, gradient: torch.Tensor) -> torch.Tensor:
        if self.momentum is None:
            self.momentum = gradient.clone()
        else:
            self.momentum.mul_(self.beta).add_(gradient, alpha=1 - self.beta)
        return self.momentum


class CenteredClipping:
    """Centered clipping: ``iterations`` steps of ``v += mean_i CLIP(x_i - v, tau)``.

    ``v`` starts at the previous round's output (zero in the first round).
    ``radius=None`` takes ``tau`` each step as the median distance ``||x_i - v||``,
    a choice of ours for when no fixed radius is known; with fewer than half
    Byzantine rows the median is an honest distance.
    """

    def __init__(self, radius: float | None, iterations: int = 1):
        if radius is not None and radius < 0:
            raise ValueError(f"radius must be >= 0, got {radius}")
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        self.radius = radius
        self.iterations = iterations
        self.center: torch.Tensor | None = None

    def __call__(self, vectors: torch.Tensor) -> torch.Tensor:
        n = _rows(vectors).shape[0]
        v = torch.zeros_like(vectors[0]) if self.center is None else self.center.clone()
        for _ in range(self.iterations):
            differences = vectors - v
            tau = self.radius
            if tau is None:
                norms = torch.nan_to_num(differences.norm(dim=1), nan=torch.inf)
                tau = norms.median().item()
            v = v + sum(clip(d, tau) for d in differences) / n
        self.center = v
        return v.clone()
