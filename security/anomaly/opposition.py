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

import math
from collections.abc import Mapping, Sequence, Set
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
    peers = list(pulls)
    if len(peers) < 2:
        return opposition_from_gram(peers, torch.zeros(len(peers), len(peers), dtype=torch.float64), threshold)
    # one float32 Gram matrix of the pulls gives every norm and cosine (a float64 copy of [k, D] cost 10x more)
    stacked = torch.stack([pulls[p].detach().reshape(-1) for p in peers]).to(torch.float32)
    return opposition_from_gram(peers, (stacked @ stacked.T).to(torch.float64), threshold)


def opposition_from_gram(peers: Sequence[int], gram: torch.Tensor, threshold: float = OPPOSED_COSINE) -> Opposition:
    """``find_opposition`` from the Gram matrix of the pulls (rows in the order of ``peers``).

    ``UpdateScreener.screen_round`` computes it on the way (``RoundScreening.pull_gram``), so the
    receiver reads its vectors once for both.
    """
    if not -1 <= threshold <= 1:
        raise ValueError(f"threshold must be a cosine in [-1, 1], got {threshold}")
    if gram.shape != (len(peers), len(peers)):
        raise ValueError(f"the Gram matrix must be {len(peers)} x {len(peers)}, got {tuple(gram.shape)}")
    finite = [k for k, value in enumerate(gram.diagonal().tolist()) if math.isfinite(value)]
    if len(finite) < 2:
        return Opposition((), {})
    kept = [peers[k] for k in finite]
    gram = gram[finite][:, finite]
    norms = gram.diagonal().sqrt()
    cosines = gram / (norms[:, None] * norms[None, :]).clamp_min(1e-30)
    norm_values = norms.tolist()
    pairs: list[tuple[int, int]] = []
    caps: dict[int, float] = {}
    for a, b in (cosines < threshold).triu(diagonal=1).nonzero().tolist():
        pairs.append((kept[a], kept[b]))
        nearer = min(norm_values[a], norm_values[b])
        for k in (a, b):
            caps[kept[k]] = min(caps.get(kept[k], math.inf), nearer)
    return Opposition(tuple(pairs), caps)
