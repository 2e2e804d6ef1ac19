"""Many GASLoC workers in one process, on flat parameter vectors.

The exchange is an in-memory hand-over of each worker's wire payload, so tests
and benchmarks run the exact outer round the real workers run, including
compression, skipped (dead) workers and per-worker counts of the payload bytes handed over.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from .outer import OuterStep, RoundStats
from .topology import Topology


class Simulator:
    """``topology.n`` workers, each with its own ``OuterStep``."""

    def __init__(
        self,
        topology: Topology,
        outer_lr: float,
        outer_momentum: float,
        gossip_step: float | None = None,
        compression: str = "none",
        error_feedback: bool = True,
    ):
        self.topology = topology
        self.workers = [
            OuterStep(topology, i, outer_lr, outer_momentum, gossip_step, compression, error_feedback)
            for i in range(topology.n)
        ]
        self.bytes_sent = [0] * topology.n

    def round(
        self,
        t: int,
        thetas: Sequence[torch.Tensor],
        thetas_after: Sequence[torch.Tensor],
        dead: Collection[int] = (),
        cut: Collection[tuple[int, int]] = (),
    ) -> tuple[list[torch.Tensor], dict[int, RoundStats]]:
        """One outer round for every live worker; a dead worker keeps its theta and sends nothing.

        ``cut`` edges ``(i, j)`` with ``i < j`` missed the round's deadline: both ends skip each other.
        """
        if len(thetas) != self.topology.n or len(thetas_after) != self.topology.n:
            raise ValueError(f"expected {self.topology.n} parameter vectors")
        proposals = {
            i: worker.propose(t, thetas[i], thetas_after[i]) for i, worker in enumerate(self.workers) if i not in dead
        }
        nexts = list(thetas)
        stats = {}
        for i, proposal in proposals.items():
            received = {
                j: proposals[j].wire for j in proposal.peers if j in proposals and (min(i, j), max(i, j)) not in cut
            }
            nexts[i], stats[i] = self.workers[i].finish(proposal, received)
            sent_to = [j for j in proposal.peers if j in proposals and (min(i, j), max(i, j)) not in cut]
            self.bytes_sent[i] += proposal.wire.numel() * proposal.wire.element_size() * len(sent_to)
        return nexts, stats
