"""A wall-clock model of synchronous outer rounds over links of unequal bandwidth.

Every worker computes for ``compute_s`` per round (its H local steps), then
takes part in the round's transfers. A transfer is a set of workers that
communicate together: a gossip edge (two workers swapping their parameters) or
an all-reduce (every worker). A transfer can start only once all its members
are ready, so a late worker delays everyone it talks to, and that delay
travels one hop per round through a gossip graph:

    ready_i(t)  = finish_i(t-1) + compute_s                 (finish_i(-1) = 0)
    done_T(t)   = max_{m in T} ready_m(t) + seconds_T
    finish_i(t) = max(ready_i(t), max_{T used in round t, i in T} done_T(t))

With a per-round deadline ``D`` (as in the gossip transport) a transfer is
used only if it is done by every member's deadline ``ready_m(t) + D``;
otherwise it is skipped, each member waits out its own deadline
(``finish_i(t) >= ready_i(t) + D``) and the outer step mixes without it.

Links are independent and full duplex: a worker swaps with two peers at once
at each link's own rate. A swap of ``nbytes`` takes ``latency + nbytes / bw``;
a ring all-reduce takes ``2 (n-1)`` steps of ``nbytes / n`` over every ring
link at once, so it is bounded by the slowest ring link.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Edge = tuple[int, int]
ON_TIME_S = 1e-9  # a transfer done this close to the deadline counts as in time (float rounding)


def edge(i: int, j: int) -> Edge:
    return (i, j) if i < j else (j, i)


@dataclass(frozen=True)
class Network:
    """``n`` workers; every pair linked at ``bandwidth`` bytes/s unless ``link_bandwidth`` says otherwise."""

    n: int
    bandwidth: float
    latency_s: float
    link_bandwidth: Mapping[Edge, float] = field(default_factory=dict)

    def __post_init__(self):
        rates = [self.bandwidth, *self.link_bandwidth.values()]
        if self.n < 2 or min(rates) <= 0 or self.latency_s < 0:
            raise ValueError("a network needs n >= 2, positive bandwidths and a non-negative latency")

    def bandwidth_of(self, i: int, j: int) -> float:
        return self.link_bandwidth.get(edge(i, j), self.bandwidth)

    def swap_seconds(self, i: int, j: int, nbytes: float) -> float:
        """Time for ``i`` and ``j`` to send each other ``nbytes`` (both directions at once)."""
        return self.latency_s + nbytes / self.bandwidth_of(i, j)

    def ring_allreduce_seconds(self, nbytes: float) -> float:
        """A ring all-reduce over workers 0..n-1 in order: ``2 (n-1)`` steps of ``nbytes / n``."""
        slowest = min(self.bandwidth_of(i, (i + 1) % self.n) for i in range(self.n))
        return 2 * (self.n - 1) * (self.latency_s + nbytes / self.n / slowest)


@dataclass(frozen=True)
class Transfer:
    """Workers that communicate together for ``seconds``, each sending ``nbytes``."""

    members: tuple[int, ...]
    seconds: float
    nbytes: float


def gossip_transfers(network: Network, edges: Iterable[Edge], nbytes: float) -> list[Transfer]:
    """One swap of ``nbytes`` per edge."""
    return [Transfer(edge(i, j), network.swap_seconds(i, j, nbytes), nbytes) for i, j in sorted(edges)]


def allreduce_transfer(network: Network, nbytes: float) -> Transfer:
    """A ring all-reduce of an ``nbytes`` vector; each worker sends ``2 (n-1)/n`` of it."""
    n = network.n
    return Transfer(tuple(range(n)), network.ring_allreduce_seconds(nbytes), 2 * (n - 1) / n * nbytes)


@dataclass(frozen=True)
class Round:
    ready: tuple[float, ...]  # when each worker finished its local steps
    finish: tuple[float, ...]  # when each worker finished the round's communication
    skipped: frozenset[tuple[int, ...]]  # members of the transfers cut by the deadline
    sent: tuple[float, ...]  # bytes each worker sent; a cut transfer counts what went out before the cut


def schedule(
    n: int, rounds: Iterable[Sequence[Transfer]], compute_s: float, deadline_s: float | None = None
) -> list[Round]:
    """Event times of ``n`` workers through ``rounds`` (each round's transfers), from time 0."""
    finish = [0.0] * n
    out = []
    for transfers in rounds:
        ready = [f + compute_s for f in finish]
        finish = list(ready)
        sent = [0.0] * n
        skipped = set()
        for transfer in transfers:
            start = max(ready[m] for m in transfer.members)
            done = start + transfer.seconds
            cutoff = min(ready[m] for m in transfer.members) + deadline_s if deadline_s is not None else done
            if done <= cutoff + ON_TIME_S:
                for m in transfer.members:
                    finish[m] = max(finish[m], done)
                    sent[m] += transfer.nbytes
                continue
            skipped.add(transfer.members)
            share = min(1.0, max(0.0, (cutoff - start) / transfer.seconds))
            for m in transfer.members:
                finish[m] = max(finish[m], ready[m] + deadline_s)
                sent[m] += share * transfer.nbytes
        out.append(Round(tuple(ready), tuple(finish), frozenset(skipped), tuple(sent)))
    return out
