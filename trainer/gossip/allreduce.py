"""Bandwidth-optimal ring all-reduce over pairwise swaps: reduce-scatter, then all-gather.

DiLoCo runs the streamed all-reduce of :mod:`.reduce` (two hops instead of
``2 (n - 1)`` swaps); this one works over any ``swap`` and is the baseline
``benchmarks/bench_allreduce.py`` measures it against.

The vector is cut into ``n`` chunks per ring. In each of the ``n - 1``
reduce-scatter steps a worker sends one chunk to its ring successor and adds
the chunk its predecessor sent into its own; then each worker holds one chunk
summed over everyone, and ``n - 1`` all-gather steps pass the summed chunks
round. Each worker sends ``2 (n - 1) / n`` of the vector in all, whatever
``n`` is.

The gossip transport swaps payloads: both ends of an edge send. So for
``n > 2`` the vector is split in two halves that travel round the ring in
opposite directions; in every step a worker sends one chunk of the first
half to its right neighbour and one chunk of the second half to its left one,
and receives the mirror images. For ``n = 2`` the two neighbours are the same
worker and one ring over the whole vector suffices. Chunks are padded to one
size, so every payload of the all-reduce has the same size. Chunks may
travel as ``wire_dtype`` (bf16 halves the traffic); sums stay in the
vector's own dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

Swap = Callable[[int, Mapping[int, torch.Tensor]], Mapping[int, torch.Tensor]]
"""``swap(step, {peer: payload}) -> {peer: payload it sent}``; a missing peer's edge failed."""


class AllReduceFailed(RuntimeError):
    """A link or member of the all-reduce failed, so this worker cannot have the sum."""


def ring_steps(n: int) -> int:
    """Swaps one ring all-reduce among ``n`` workers takes."""
    return 2 * (n - 1)


def ring_allreduce(
    vector: torch.Tensor, members: Sequence[int], me: int, swap: Swap, wire_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The sum over ``members`` (ascending worker indices, ``me`` among them) of their 1-D float ``vector``.

    Every member must call it with a vector of the same size and the same
    ``members``. Raises ``AllReduceFailed`` if any swap this worker needs fails.
    """
    n = len(members)
    pos = list(members).index(me)
    if n == 1:
        return vector.clone()
    wire = wire_dtype or vector.dtype
    directions = (1,) if n == 2 else (1, -1)
    length = vector.numel()
    chunk = max(1, math.ceil(length / (len(directions) * n)))
    buffer = torch.zeros(len(directions) * n * chunk, dtype=vector.dtype)
    buffer[:length] = vector.reshape(-1)
    blocks = {d: buffer[k * n * chunk : (k + 1) * n * chunk].view(n, chunk) for k, d in enumerate(directions)}

    def run(step: int, sent: int, taken: int, reduce: bool) -> None:
        """Swap: send chunk ``pos + d * sent`` of each ring, take chunk ``pos + d * taken`` from the predecessor."""
        payloads = {members[(pos + d) % n]: blocks[d][(pos + d * sent) % n].to(wire, copy=True) for d in directions}
        got = swap(step, payloads)
        for d in directions:
            source = members[(pos - d) % n]
            if source not in got:
                raise AllReduceFailed(f"step {step}: no chunk from worker {source}")
            row = blocks[d][(pos + d * taken) % n]
            row.add_(got[source].to(row.dtype)) if reduce else row.copy_(got[source])

    for k in range(n - 1):  # reduce-scatter: afterwards this worker holds chunk pos + d summed
        run(k, -k, -(k + 1), reduce=True)
    for d in directions:  # round the summed chunk as the others will get it, so every worker ends equal
        owned = blocks[d][(pos + d) % n]
        owned.copy_(owned.to(wire).to(owned.dtype))
    for k in range(n - 1):  # all-gather
        run(n - 1 + k, 1 - k, -k, reduce=False)
    return buffer[:length].clone()
