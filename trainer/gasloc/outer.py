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

Gossip weights the same way. Every payload ends with its sender's weight
``s_j`` (4 bytes), and worker i mixes ``z_i = sum_j W_ij s_j ŷ_j / sum_j
W_ij s_j`` (``W`` the round's mixing matrix over the peers mixed, ``ŷ_i``
its own sent value): ``z_i = y_i + sum_j p_ij (ŷ_j - ŷ_i)`` with ``p_ij =
alpha s_j / ((1 - k alpha) s_i + alpha sum_k s_k)``. Equal weights give
``p_ij = alpha``, plain gossip, exactly. On the complete graph with
``alpha = 1/n`` it is the all-reduce's weighted mean, so the DiLoCo
equivalence above holds with weights too. With unequal weights the mixing is
row- but not column-stochastic: the workers' mean moves towards the workers
that did more steps, which is the point of weighting, so the mean is kept
exactly only when the weights are equal. A peer's claimed weight counts at
most ``WEIGHT_CAP`` times the receiver's own, so a lying peer cannot take
over the mix by claiming many steps.

``OuterStep`` works on flat float32 vectors and splits a round into
``propose`` (before the exchange) and ``finish`` (after it), so a simulator can
run many workers in one process; ``GASLoCOuter`` wraps it for one worker's
``torch.nn.Module`` parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from .compression import Compressor
from .topology import Topology

Exchange = Callable[[int, list[int], torch.Tensor], Mapping[int, torch.Tensor]]
"""``exchange(round, peers, wire) -> {peer: peer's wire}``; a missing peer was skipped."""

AllReduce = Callable[[int, torch.Tensor], torch.Tensor | None]
"""``allreduce(round, vector) -> the sum of every worker's vector``, or None if it failed."""

Canary = Callable[[torch.Tensor], torch.Tensor]
"""``canary(y - theta_t) -> a small secret vector`` the worker adds to the point it sends, so that a
payload crafted from it can be recognised (the screening's ``echo`` check); the mix differences
are taken from the sent point, so the workers' mean is kept."""

Screen = Callable[["Proposal", dict[int, torch.Tensor]], Mapping[int, torch.Tensor]]
"""``screen(proposal, decoded) -> {peer: value to mix}``: drops or clips the decoded
payloads that fail screening; a dropped peer counts as skipped."""


WEIGHT_CAP = 4.0  # a peer's claimed weight counts at most this many times the receiver's own


def with_weight(wire: torch.Tensor, weight: float) -> torch.Tensor:
    """``wire`` followed by ``weight`` as float32, in the wire's own dtype (4 bytes)."""
    return torch.cat([wire, torch.tensor([weight], dtype=torch.float32).view(wire.dtype)])


def split_weight(payload: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(wire, weight)`` of a payload made by ``with_weight``; ValueError unless the weight is finite and > 0."""
    size = 4 // payload.element_size()
    if payload.dim() != 1 or payload.numel() < size:
        raise ValueError("payload too short to carry a weight")
    weight = payload[-size:].clone().view(torch.float32).item()
    if not (math.isfinite(weight) and weight > 0):
        raise ValueError(f"payload weight {weight} is not a positive number")
    return payload[:-size], weight


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
    wire: torch.Tensor  # the payload: the encoded ŷ, then the weight
    peers: tuple[int, ...]
    pseudo_gradient_norm: float
    weight: float = 1.0  # inner steps done (time-budgeted rounds); equal weights are plain gossip
    canary: torch.Tensor | None = None  # what was added to y before it was encoded (``Canary``)


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
        canary: Canary | None = None,
    ):
        if not 0 <= worker_index < topology.n:
            raise ValueError(f"worker {worker_index} is not in 0..{topology.n - 1}")
        self.topology = topology
        self.worker_index = worker_index
        self.outer_lr = outer_lr
        self.outer_momentum = outer_momentum
        self.gossip_step = gossip_step
        self.compressor = Compressor(compression, error_feedback)
        self.canary = canary
        self.z_prev: torch.Tensor | None = None

    def propose(self, t: int, theta_t: torch.Tensor, theta_after: torch.Tensor, weight: float = 1.0) -> Proposal:
        """Steps 1-2: the proposed point and its wire form for round ``t``, carrying ``weight``."""
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight must be a positive number, got {weight}")
        g = theta_after - theta_t
        y = theta_t + self.outer_lr * g
        canary = None if self.canary is None else self.canary(y - theta_t)
        wire, sent = self.compressor.compress(y if canary is None else y + canary)
        peers = tuple(self.topology.neighbors(self.worker_index, t))
        return Proposal(t, theta_t, y, sent, with_weight(wire, weight), peers, float(g.norm()), weight, canary)

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
        decoded, weights = {}, {}
        for peer in proposal.peers:
            if peer not in received:
                continue
            try:
                wire, weight = split_weight(received[peer])
                decoded[peer] = self.compressor.decompress(wire, proposal.y.numel())
            except ValueError:  # malformed: the peer is skipped
                continue
            weights[peer] = min(weight, WEIGHT_CAP * proposal.weight)
        if screen is not None and decoded:
            decoded = dict(screen(proposal, decoded))
        alpha = self.topology.metropolis_step(proposal.round) if self.gossip_step is None else self.gossip_step
        z = proposal.y.clone()
        mixed = [peer for peer in proposal.peers if peer in decoded]
        equal = all(weights[peer] == proposal.weight for peer in mixed)
        total = (1 - alpha * len(mixed)) * proposal.weight + alpha * sum(weights[peer] for peer in mixed)
        for peer in mixed:
            z.add_(decoded[peer] - proposal.sent, alpha=alpha if equal else alpha * weights[peer] / total)
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
        weight: float = 1.0,
    ) -> tuple[torch.Tensor, RoundStats]:
        """A whole round: propose, ``exchange`` with the round's peers, finish."""
        proposal = self.propose(t, theta_t, theta_after, weight)
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


def flatten(params: Iterable[torch.Tensor]) -> torch.Tensor:
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
        params: Iterable[torch.Tensor],
        topology: Topology,
        worker_index: int,
        outer_lr: float,
        outer_momentum: float,
        gossip_step: float | None = None,
        compression: str = "none",
        error_feedback: bool = True,
        canary: Canary | None = None,
    ):
        self.params = list(params)
        self.step = OuterStep(
            topology, worker_index, outer_lr, outer_momentum, gossip_step, compression, error_feedback, canary
        )
        self.theta = flatten(self.params)

    @torch.no_grad()
    def round(self, t: int, exchange: Exchange, screen: Screen | None = None, weight: float = 1.0) -> RoundStats:
        theta_next, stats = self.step.round(t, self.theta, flatten(self.params), exchange, screen, weight)
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
