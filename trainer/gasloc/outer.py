"""The GASLoC outer round (DiLoCo is its complete-graph case).

For round t, worker i, after its H inner steps:

1. pseudo-gradient ``g = theta_after - theta_t``;
2. proposed point ``y = theta_t + eta * g``;
3. gossip mix ``z = y - alpha * sum_j (ŷ_i - ŷ_j)`` over the round's live edges,
   where ``ŷ`` is the value as sent on the wire (``y`` itself without compression);
   using the sender's own decoded value on both ends keeps the workers' mean
   exact even with lossy compression;
4. accelerated step ``theta_{t+1} = z_t + gamma * (z_t - z_{t-1})`` with
   ``z_{-1} = theta_0``.

On the complete graph with ``alpha = 1/n`` this is DiLoCo: Nesterov SGD
(lr ``eta``, momentum ``gamma``) on ``delta = -mean(g)``. A DiLoCo job gets
step 3 from a ring all-reduce instead (``finish_mean``): ``z = sum_i w_i y_i /
sum_i w_i``, the same value for ``2 (n - 1) / n`` of the parameters sent per
worker instead of ``n - 1`` times them. With weights ``w_i`` (inner steps done
in a time-budgeted round) it is Nesterov SGD on ``-sum_i w_i g_i / sum_i w_i``;
with equal weights, DiLoCo exactly.

``OuterStep`` works on flat float32 vectors and splits a round into
``propose`` (before the exchange) and ``finish`` (after it), so a simulator can
run many workers in one process; ``GASLoCOuter`` wraps it for one worker's
``torch.nn.Module`` parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from .compression import Compressor
from .topology import Topology

Exchange = Callable[[int, list[int], torch.Tensor], Mapping[int, torch.Tensor]]
"""``exchange(round, peers, wire) -> {peer: peer's wire}``; a missing peer was skipped."""

AllReduce = Callable[[int, torch.Tensor], torch.Tensor | None]
"""``allreduce(round, vector) -> the sum of every worker's vector``, or None if it failed."""

Screen = Callable[["Proposal", dict[int, torch.Tensor]], Mapping[int, torch.Tensor]]
"""``screen(proposal, decoded) -> {peer: value to mix}``: drops or clips the decoded
payloads that fail screening; a dropped peer counts as skipped."""


@dataclass(frozen=True)
class RoundStats:
    round: int
    peers: tuple[int, ...]  # the round's planned peers
    mixed: tuple[int, ...]  # peers whose payload arrived and was mixed in
    skipped: tuple[int, ...]  # planned peers that were dead, late or sent a malformed payload
    pseudo_gradient_norm: float


@dataclass(frozen=True)
class Proposal:
    """A round between ``propose`` and ``finish``: what to send, and to whom."""

    round: int
    theta: torch.Tensor  # theta_t, used as z_{-1} in round 0
    y: torch.Tensor
    sent: torch.Tensor  # ŷ: y as the peers will decode it
    wire: torch.Tensor
    peers: tuple[int, ...]
    pseudo_gradient_norm: float


class OuterStep:
    """One worker's outer optimizer on flat float32 parameter vectors."""

    def __init__(
        self,
        topology: Topology,
        worker_index: int,
        outer_lr: float,
        outer_momentum: float,
        gossip_step: float | None = None,
        compression: str = "none",
        error_feedback: bool = True,
    ):
        if not 0 <= worker_index < topology.n:
            raise ValueError(f"worker {worker_index} is not in 0..{topology.n - 1}")
        self.topology = topology
        self.worker_index = worker_index
        self.outer_lr = outer_lr
        self.outer_momentum = outer_momentum
        self.gossip_step = gossip_step
        self.compressor = Compressor(compression, error_feedback)
        self.z_prev: torch.Tensor | None = None

    def propose(self, t: int, theta_t: torch.Tensor, theta_after: torch.Tensor) -> Proposal:
        """Steps 1-2: the proposed point and its wire form for round ``t``."""
        g = theta_after - theta_t
        y = theta_t + self.outer_lr * g
        wire, sent = self.compressor.compress(y)
        peers = tuple(self.topology.neighbors(self.worker_index, t))
        return Proposal(t, theta_t, y, sent, wire, peers, float(g.norm()))

    def finish(
        self, proposal: Proposal, received: Mapping[int, torch.Tensor], screen: Screen | None = None
    ) -> tuple[torch.Tensor, RoundStats]:
        """Steps 3-4: decode and ``screen`` what arrived, mix it, take the accelerated step; return theta_{t+1}.

        Screening sees decoded float32 values, so a compressed payload is
        screened exactly like an uncompressed one.
        """
        unexpected = set(received) - set(proposal.peers)
        if unexpected:
            raise ValueError(f"payloads from workers {sorted(unexpected)} that are not round {proposal.round} peers")
        decoded = {}
        for peer in proposal.peers:
            if peer not in received:
                continue
            try:
                decoded[peer] = self.compressor.decompress(received[peer], proposal.y.numel())
            except ValueError:  # malformed: the peer is skipped
                continue
        if screen is not None and decoded:
            decoded = dict(screen(proposal, decoded))
        alpha = self.topology.metropolis_step(proposal.round) if self.gossip_step is None else self.gossip_step
        z = proposal.y.clone()
        mixed = [peer for peer in proposal.peers if peer in decoded]
        for peer in mixed:
            z.add_(decoded[peer] - proposal.sent, alpha=alpha)
        theta_next = self._accelerate(proposal, z)
        stats = RoundStats(
            round=proposal.round,
            peers=proposal.peers,
            mixed=tuple(mixed),
            skipped=tuple(p for p in proposal.peers if p not in mixed),
            pseudo_gradient_norm=proposal.pseudo_gradient_norm,
        )
        return theta_next, stats

    def finish_mean(self, proposal: Proposal, mean: torch.Tensor | None) -> tuple[torch.Tensor, RoundStats]:
        """Steps 3-4 with ``z`` the workers' (weighted) mean of y from an all-reduce; None (it failed): ``z = y``."""
        z = proposal.y.clone() if mean is None else mean
        theta_next = self._accelerate(proposal, z)
        mixed = proposal.peers if mean is not None else ()
        skipped = () if mean is not None else proposal.peers
        return theta_next, RoundStats(proposal.round, proposal.peers, mixed, skipped, proposal.pseudo_gradient_norm)

    def _accelerate(self, proposal: Proposal, z: torch.Tensor) -> torch.Tensor:
        z_prev = proposal.theta if self.z_prev is None else self.z_prev
        self.z_prev = z
        return z + self.outer_momentum * (z - z_prev)

    def round(
        self,
        t: int,
        theta_t: torch.Tensor,
        theta_after: torch.Tensor,
        exchange: Exchange,
        screen: Screen | None = None,
    ) -> tuple[torch.Tensor, RoundStats]:
        """A whole round: propose, ``exchange`` with the round's peers, finish."""
        proposal = self.propose(t, theta_t, theta_after)
        received = exchange(t, list(proposal.peers), proposal.wire) if proposal.peers else {}
        return self.finish(proposal, received, screen)

    def round_mean(
        self, t: int, theta_t: torch.Tensor, theta_after: torch.Tensor, allreduce: AllReduce, weight: float = 1.0
    ) -> tuple[torch.Tensor, RoundStats]:
        """A DiLoCo round: ``allreduce`` ``[w y, w]`` over all workers, then the accelerated step on the mean."""
        proposal = self.propose(t, theta_t, theta_after)
        total = allreduce(t, torch.cat([proposal.y * weight, torch.tensor([weight], dtype=proposal.y.dtype)]))
        mean = None if total is None else total[:-1] / total[-1]
        return self.finish_mean(proposal, mean)

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        return {"z_prev": self.z_prev, "residual": self.compressor.residual}

    def load_state_dict(self, state: Mapping[str, torch.Tensor | None]) -> None:
        self.z_prev = state["z_prev"]
        self.compressor.residual = state["residual"]


def flatten(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """A new float32 CPU vector holding ``params`` (never a view of them)."""
    return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in params])


class GASLoCOuter:
    """The outer optimizer of one worker's model.

    Build it once the model holds theta_0 (after any checkpoint load); call
    ``round(t, exchange)`` after every H inner steps. It keeps its own copy of
    theta_t, computes theta_{t+1} and writes it into the parameters in place,
    so the inner optimizer and its state carry on untouched.

        outer = GASLoCOuter(model.parameters(), make_topology("ring", n, seed),
                            worker_index=i, outer_lr=0.7, outer_momentum=0.9)
        for t in range(rounds):
            ...H inner steps...
            stats = outer.round(t, lambda r, peers, wire: node.exchange(r, {p: addrs[p] for p in peers}, wire))
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        topology: Topology,
        worker_index: int,
        outer_lr: float,
        outer_momentum: float,
        gossip_step: float | None = None,
        compression: str = "none",
        error_feedback: bool = True,
    ):
        self.params = list(params)
        self.step = OuterStep(
            topology, worker_index, outer_lr, outer_momentum, gossip_step, compression, error_feedback
        )
        self.theta = flatten(self.params)

    @torch.no_grad()
    def round(self, t: int, exchange: Exchange, screen: Screen | None = None) -> RoundStats:
        theta_next, stats = self.step.round(t, self.theta, flatten(self.params), exchange, screen)
        self._write(theta_next)
        return stats

    @torch.no_grad()
    def round_mean(self, t: int, allreduce: AllReduce, weight: float = 1.0) -> RoundStats:
        """A DiLoCo round (see ``OuterStep.round_mean``), written into the parameters."""
        theta_next, stats = self.step.round_mean(t, self.theta, flatten(self.params), allreduce, weight)
        self._write(theta_next)
        return stats

    def _write(self, theta_next: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            p.copy_(theta_next[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.theta = theta_next

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        return {"theta": self.theta, **self.step.state_dict()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor | None]) -> None:
        """Restore after a restart; the parameters must already hold ``state["theta"]``."""
        theta = state["theta"]
        if theta is None:
            raise ValueError("the state holds no theta")
        self.theta = theta.clone()
        self.step.load_state_dict(state)
