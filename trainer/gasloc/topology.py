"""Communication graphs for gossip rounds.

A topology says, for every outer round, which pairs of workers exchange
parameters. Static graphs (ring, 2-D torus, exponential, complete) are the same
every round; matchings are redrawn each round from a seed the whole job shares,
so every worker computes the same pairs without a coordinator.

Mixing is ``W = I - alpha * L`` with ``L`` the Laplacian of the round's live
edges (``lambda_ij = 1``). ``alpha`` defaults to the Metropolis step
``1 / (d_max + 1)`` of the round's full graph, so it does not depend on who is
alive; removing an edge (a dead or slow peer) moves its weight back to the
diagonal and ``W`` stays symmetric and doubly stochastic.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Collection

import torch

from cantata.proto import vocabulary

Edge = tuple[int, int]


class UnknownTopology(ValueError):
    """A topology name that is not one of ``TOPOLOGIES``."""


class Topology(ABC):
    """The undirected communication graph of each round among ``n`` workers."""

    name: str

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"a topology needs at least one worker, got n={n}")
        self.n = n

    @abstractmethod
    def edges(self, round: int) -> frozenset[Edge]:
        """The round's edges as ``(i, j)`` pairs with ``i < j``."""

    def neighbors(self, worker: int, round: int) -> list[int]:
        """The peers ``worker`` exchanges with in ``round``, ascending."""
        if not 0 <= worker < self.n:
            raise ValueError(f"worker {worker} is not in 0..{self.n - 1}")
        return sorted(j if i == worker else i for i, j in self.edges(round) if worker in (i, j))

    def metropolis_step(self, round: int) -> float:
        """``1 / (d_max + 1)`` for the round's full graph (1/n on the complete graph)."""
        degree = [0] * self.n
        for i, j in self.edges(round):
            degree[i] += 1
            degree[j] += 1
        return 1.0 / (max(degree) + 1)

    def mixing_matrix(
        self, round: int, alive: Collection[int] | None = None, gossip_step: float | None = None
    ) -> torch.Tensor:
        """``I - alpha * L`` over the round's edges between ``alive`` workers (float64)."""
        alpha = self.metropolis_step(round) if gossip_step is None else gossip_step
        live = set(range(self.n)) if alive is None else set(alive)
        w = torch.eye(self.n, dtype=torch.float64)
        for i, j in self.edges(round):
            if i in live and j in live:
                w[i, j] += alpha
                w[j, i] += alpha
                w[i, i] -= alpha
                w[j, j] -= alpha
        return w


def _edge(i: int, j: int) -> Edge:
    return (i, j) if i < j else (j, i)


class StaticTopology(Topology):
    """A graph that is the same every round."""

    def __init__(self, n: int, edges: set[Edge]):
        super().__init__(n)
        self._edges = frozenset(_edge(i, j) for i, j in edges if i != j)

    def edges(self, round: int) -> frozenset[Edge]:
        return self._edges


class Ring(StaticTopology):
    name = "ring"

    def __init__(self, n: int):
        super().__init__(n, {(i, (i + 1) % n) for i in range(n)})


class Torus(StaticTopology):
    """A ``rows x cols`` wrap-around grid, ``rows`` the largest divisor of n up to sqrt(n)."""

    name = "torus"

    def __init__(self, n: int):
        rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        cols = n // rows
        self.shape = (rows, cols)
        edges = set()
        for r in range(rows):
            for c in range(cols):
                here = r * cols + c
                edges.add((here, r * cols + (c + 1) % cols))
                edges.add((here, ((r + 1) % rows) * cols + c))
        super().__init__(n, edges)


class Exponential(StaticTopology):
    """Worker i is linked to i ± 2^k (mod n) for every 2^k < n."""

    name = "exponential"

    def __init__(self, n: int):
        hops = [1 << k for k in range(max(n - 1, 1).bit_length()) if (1 << k) < n]
        super().__init__(n, {(i, (i + h) % n) for i in range(n) for h in hops})


class Complete(StaticTopology):
    """Every pair; with the Metropolis step 1/n this is exact averaging (DiLoCo)."""

    name = "complete"

    def __init__(self, n: int):
        super().__init__(n, {(i, j) for i in range(n) for j in range(i + 1, n)})


class RandomMatchings(Topology):
    """The union of ``peers`` random perfect matchings, redrawn every round from ``seed``.

    With an odd ``n`` one worker sits out of each matching. One matching per
    round (``peers=1``) with the Metropolis step 1/2 is pairwise averaging.
    """

    def __init__(self, n: int, seed: int, peers: int):
        super().__init__(n)
        self.seed = seed
        self.peers = peers
        self.name = "one-peer" if peers == 1 else "two-peer"

    def edges(self, round: int) -> frozenset[Edge]:
        rng = random.Random(f"cantata-gasloc-matching:{self.seed}:{round}")
        edges: set[Edge] = set()
        for _ in range(self.peers):
            order = list(range(self.n))
            rng.shuffle(order)
            edges.update(_edge(order[k], order[k + 1]) for k in range(0, self.n - 1, 2))
        return frozenset(edges)


TOPOLOGIES = tuple(name.value for name in vocabulary.Topology)


def make_topology(name: str, n: int, seed: int = 0) -> Topology:
    """Build a topology by its job-parameter name (one of ``TOPOLOGIES``)."""
    static = {"ring": Ring, "torus": Torus, "exponential": Exponential, "complete": Complete}
    if name in static:
        return static[name](n)
    if name == "one-peer":
        return RandomMatchings(n, seed, peers=1)
    if name == "two-peer":
        return RandomMatchings(n, seed, peers=2)
    raise UnknownTopology(f"unknown topology {name!r}; expected one of {', '.join(TOPOLOGIES)}")
