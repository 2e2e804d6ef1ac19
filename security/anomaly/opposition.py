"""Opposed pulls: two neighbours whose pulls on a receiver cancel each other.

A gossip receiver moves its point ``y`` along the pulls ``d_j = x_j - y`` of
its neighbours' points ``x_j``. Honest pulls share the receiver's own
deviation from the workers' mean (``-(y - mean)`` is in every one of them),
so two honest pulls point the same way on average: for independent
deviations their cosine is about +0.5. Dissensus (He, Karimireddy, Jaggi
2022) sends the receiver ``y - epsilon * (honest pull) / w_byzantine``: a pull
exactly opposite to the honest one (cosine -1), ``epsilon`` times as strong
at equal weights, so that mixing pushes the receiver away from its honest
neighbour instead of towards it.

With at most one Byzantine neighbour tolerated (the ring's ``b = 1``), two
pulls with a cosine below ``threshold`` mean that one of the two lies, and a
dissensus pair is a mirror image: no statistic of one round tells which one
lies (any screening verdict on them is a coin flip). So the receiver treats
an opposed pair as one unit:

- both are capped to the nearer one's distance, so they cancel instead of
  pushing the receiver away;
- both are mixed or neither: a screening rejection of one member drops the
  other as well, so a wrongly rejected honest neighbour can never leave the
  receiver alone with its mirror.

The receiver then stops mixing with that pair: it is not pushed away, but
cannot recover the honest pull either, which is the most a worker with two
neighbours, one of them lying, can guarantee. Pairs whose cosine is above
the threshold are left to the screening and ClippedGossip as before, so a
clean run (whose pulls are rarely opposed) mixes as it did.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Set
from dataclasses import dataclass

import torch

OPPOSED_COSINE = -0.5  # well below honest pulls' cosine (about +0.5), well above a mirror's (-1)


@dataclass(frozen=True)
class Opposition:
    """The opposed pairs among one round's pulls, and the distance each member is capped to."""

    pairs: tuple[tuple[int, int], ...]
    caps: Mapping[int, float]

    def whole_pairs(self, kept: Set[int]) -> set[int]:
        """``kept`` less every peer whose opposed partner is not kept (both or neither)."""
        dropped = {a for a, b in self.pairs if b not in kept} | {b for a, b in self.pairs if a not in kept}
        return set(kept) - dropped


def find_opposition(pulls: Mapping[int, torch.Tensor], threshold: float = OPPOSED_COSINE) -> Opposition:
    """Pairs of ``pulls`` (peer -> ``x_peer - y``) with a cosine below ``threshold``.

    A pull without a finite norm (NaN or Inf entries) is left out: it has no
    direction, and the screening rejects it on its own.
    """
    if not -1 <= threshold <= 1:
        raise ValueError(f"threshold must be a cosine in [-1, 1], got {threshold}")
    candidates = list(pulls)
    if len(candidates) < 2:
        return Opposition((), {})
    # one float32 Gram matrix of the pulls gives every norm and cosine (a float64 copy of [k, D] cost 10x more)
    stacked = torch.stack([pulls[p].detach().reshape(-1) for p in candidates]).to(torch.float32)
    gram = (stacked @ stacked.T).to(torch.float64)
    finite = [k for k in range(len(candidates)) if math.isfinite(gram[k, k].item())]
    if len(finite) < 2:
        return Opposition((), {})
    peers = [candidates[k] for k in finite]
    gram = gram[finite][:, finite]
    norms = gram.diagonal().sqrt()
    cosines = gram / (norms[:, None] * norms[None, :]).clamp_min(1e-30)
    pairs: list[tuple[int, int]] = []
    caps: dict[int, float] = {}
    for a, b in itertools.combinations(range(len(peers)), 2):
        if cosines[a, b].item() < threshold:
            pairs.append((peers[a], peers[b]))
            nearer = min(norms[a].item(), norms[b].item())
            for k in (a, b):
                caps[peers[k]] = min(caps.get(peers[k], math.inf), nearer)
    return Opposition(tuple(pairs), caps)
