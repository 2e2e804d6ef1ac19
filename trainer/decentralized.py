"""Decentralized training of one worker: GASLoC gossip, and DiLoCo over an all-reduce.

Each worker trains its own copy of the model for H local steps (or, with
``round_time_s``, as many as fit in that time), then runs one outer round: it
proposes y = theta_t + eta * g and either swaps y with this round's peers over
its mutual-TLS gossip endpoint, screens what it received and mixes it (gasloc),
or averages y with every worker by an all-reduce over the same endpoints
(diloco), either way weighted by inner steps done; then it applies the accelerated
outer step. Peers are found through the control plane; a dead or slow peer is
skipped for the round (its weight goes back to self) once the round deadline
(``round_deadline_s``, or adaptive) passes. A DiLoCo round whose all-reduce
fails applies the worker's own y. At the end the workers average their
parameters with one all-reduce: the job's result and its final checkpoint are
that consensus. A restarted worker resumes from the job's latest checkpoint, jumps to
the job's current round and rejoins with one exchange. Workers read disjoint
parts of the dataset; every process seals its data position beside each
checkpoint and restores it when it resumes at that step, while a worker that
rejoins at a later round seeks to where that round's batches begin.

Worker groups: with ``ranks_per_worker`` R > 1 a worker is a group of R
processes training one model. Replicated (``dp_shard`` 1: gradients averaged
over the group's own ``torch.distributed`` group, Canzona for Muon), only the
group's rank 0 gossips, and after each outer round it broadcasts the new
parameters to its ranks; on the wire (gossip identities, peers and rounds from
the control plane, reports) a group is its rank-0 process. Sharded
(``dp_shard`` = R, FSDP2 over the group), every rank gossips: rank r has its
own endpoint and certificate and swaps, screens and averages only its own
parameter shard with rank r of the peer groups, and the outer step runs per
shard, so nothing is gathered. The group's ranks agree after every exchange on
the edges used, the peers rejected, the clipping and the all-reduce's outcome
(:mod:`cantata.trainer.group_agreement`), so the shards stay one model.
Topologies are over groups; a group's screening verdicts, quarantine and
anomaly reports name its rank-0 process.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

import grpc
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from cantata.proto.vocabulary import Algorithm, Compression
from cantata.security.anomaly.attack_policy import SpecOrigin, parse_attack_config
from cantata.security.anomaly.clipping import clip
from cantata.security.anomaly.opposition import opposition_from_gram
from cantata.security.anomaly.quarantine import AnomalyKind, Quarantine
from cantata.security.anomaly.screening import (
    CANARY_SCALE,
    CheckResult,
    LayerLayout,
    ScreeningConfig,
    ScreeningResult,
    UpdateScreener,
    Verdict,
    make_canary,
)
from cantata.security.pki import Bundle
from cantata.trainer.attacks import AttackView, craft
from cantata.trainer.checkpoint import Scope, TrainingState, share_from_rank0
from cantata.trainer.config import WorkerConfig
from cantata.trainer.consensus import ConsensusFailed
from cantata.trainer.gasloc.deadline import FIRST_DEADLINE_S, RoundDeadline
from cantata.trainer.gasloc.outer import GASLoCOuter, Proposal, flatten, split_weight, with_weight
from cantata.trainer.gasloc.topology import make_topology
from cantata.trainer.gossip import GossipNode
from cantata.trainer.gossip.allreduce import AllReduceFailed
from cantata.trainer.group_agreement import GroupAgreement, local_shards, shard_layout
from cantata.trainer.loop import CPU, join_group
from cantata.trainer.parallel import Parallelism
from cantata.trainer.reporter import Reporter

PEER_WAIT_S = 60.0
log = logging.getLogger(__name__)
# Real jobs mix few, short rounds: a layer's share of the distance varies more
# than in the benchmark's simulation, so its spread is floored higher (honest
# peers were otherwise rejected on layer norms late in training).
WORKER_SCREENING = ScreeningConfig(layer_min_spread=0.3)  # at start, for the other workers' gossip endpoints


class GossipExchange:
    """The round's exchanges as ``GASLoCOuter`` calls them: wait for laggards, then swap over gossip.

    ``__call__`` swaps wires with the round's peers (gasloc); ``allreduce`` sums
    a vector over every live worker by the transport's all-reduce (diloco, and
    the final consensus). Peers are worker groups; on the wire a group is the
    process of this one's rank in it (rank 0 unless the groups are sharded).
    Quarantined groups are not dialled. With sharded groups the group's ranks
    keep only the edges every shard used, and an all-reduce's sum only if
    every shard's all-reduce succeeded (``agreement``).

    Rounds stay aligned: a gasloc round leaves out at once the peers already
    done with it (as the control plane says), waits up to its deadline for
    the others, and gives up on a peer as soon as it is gone (its endpoint
    withdrawn) or done with the round without this worker. So a worker that
    fell behind (held up by a dead peer, or restarted) runs its rounds without
    exchanges until it has caught up, while its peers wait for it.

    Lateness is no evidence of lying: a peer that missed a round with this
    worker (it timed out, sent nothing, was gone, or was done without it)
    gets the grace a restarted one gets (``Quarantine.grace``), and a worker
    that finds most of the others done with a round before it (it was paused
    or slow) catches up like a rejoining one (``behind``).
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        node: GossipNode,
        reporter: Reporter,
        outer: GASLoCOuter,
        quarantine: Quarantine,
        deadline: RoundDeadline,
        agreement: GroupAgreement | None = None,
        behind: Callable[[int], None] = lambda round_: None,
    ):
        self._cfg, self._node, self._reporter, self._outer = cfg, node, reporter, outer
        self._quarantine, self.deadline, self._behind = quarantine, deadline, behind
        self._agreement = agreement or GroupAgreement(None)
        self._attack = parse_attack_config(cfg.attack, SpecOrigin.ADMIN) if cfg.attack else None
        self._noise = torch.Generator().manual_seed(cfg.spec.seed + cfg.worker)
        self._wire_dtype = torch.bfloat16 if cfg.spec.compression == Compression.BF16 else None
        self.addresses: dict[int, str] = {}
        self.rounds: dict[int, int] = {}  # each worker's latest finished round, as the control plane last said
        self._restarts: dict[int, int] = {}  # how often the server had restarted each, when first or last seen
        self._traffic: dict[int, list[int]] = {}  # peer process -> [payload bytes sent, received] this round
        self.ring: tuple[int, ...] = ()  # the other worker groups the last all-reduce summed over (none if it failed)
        self.failure = ""  # why the last all-reduce failed ("" if it did not)

    def take_traffic(self) -> dict[int, tuple[int, int]]:
        """Payload bytes sent to and received from each peer process since the last call."""
        taken, self._traffic = self._traffic, {}
        return {peer: (sent, received) for peer, (sent, received) in taken.items()}

    def _count(self, sent: Mapping[int, torch.Tensor], received: Mapping[int, torch.Tensor]) -> None:
        for peer, tensor in sent.items():
            self._traffic.setdefault(peer, [0, 0])[0] += tensor.numel() * tensor.element_size()
        for peer, tensor in received.items():
            self._traffic.setdefault(peer, [0, 0])[1] += tensor.numel() * tensor.element_size()

    def __call__(self, round_: int, groups: list[int], wire: torch.Tensor) -> dict[int, torch.Tensor]:
        """Exchange with the worker groups ``groups``; returns the wire each one whose edge was used sent."""
        peers = [self._cfg.shard_peer(g) for g in groups]
        sent = self._maybe_attack(round_, wire)
        self._refresh(round_)
        if self._agreement.first(self._most_done(round_)):  # a sharded group's shards screen alike
            self._behind(round_)
        trusted = [p for p in peers if self._trusted(p)]
        wanted = {p: self.addresses[p] for p in trusted if not self._done(p, round_)}
        received = self._node.exchange(
            round_, wanted, sent, deadline_s=self.deadline.seconds, gone=self._gone(round_, wanted)
        )
        self._count(dict.fromkeys(wanted, sent), received)
        for late in set(trusted) - set(received):  # late, on its side or this worker's: no evidence that it lies
            self._quarantine.grace(self._cfg.gossip_process(late // self._cfg.ranks_per_worker), round_)
        usable = {peer // self._cfg.ranks_per_worker: t.clone() for peer, t in received.items() if _readable(t, sent)}
        agreed = self._agreement.common(usable)  # a sharded group mixes a peer in every shard or in none
        return {group: t for group, t in usable.items() if group in agreed}

    def allreduce(self, round_: int, vector: torch.Tensor) -> torch.Tensor | None:
        """A diloco round's all-reduce of ``[w y, w]`` (an admin-planned attack replaces y first)."""
        return self.sum(round_, self._maybe_attack_mean(round_, vector))

    def sum(self, round_: int, vector: torch.Tensor, deadline_s: float | None = None) -> torch.Tensor | None:
        """The sum of ``vector`` over every live, trusted worker (``GossipNode.allreduce``); None if it failed.

        The members are every trusted worker in this round (after the bounded
        wait for laggards), so a dead worker drops out once the others have
        moved on; the all-reduce gives up as soon as a member is gone or done
        with the round. One deadline (the round's, unless ``deadline_s`` says
        otherwise) covers the whole all-reduce.
        """
        me = self._cfg.worker
        others = [self._cfg.shard_peer(g) for g in range(self._cfg.workers) if g != self._cfg.group]
        self._wait_for_laggards(round_, others)
        live = [p // self._cfg.ranks_per_worker for p in others if self._trusted(p) and self._in_round(p, round_)]
        groups = self._agreement.first(live)  # a sharded group's rank 0 names the ring for all its shards
        members = [self._cfg.shard_peer(g) for g in groups]
        addresses = {p: self.addresses[p] for p in members if p in self.addresses}
        self.failure = ""
        total: torch.Tensor | None = None
        try:
            if len(addresses) < len(members):
                raise AllReduceFailed(f"no endpoint for workers {sorted(set(members) - addresses.keys())}")
            total, traffic = self._node.allreduce(
                round_,
                addresses,
                vector,
                deadline_s=self.deadline.seconds if deadline_s is None else deadline_s,
                gone=self._gone(round_, addresses),
                wire_dtype=self._wire_dtype,
            )
            for peer, (sent, received) in traffic.items():
                counts = self._traffic.setdefault(peer, [0, 0])
                counts[0], counts[1] = counts[0] + sent, counts[1] + received
        except AllReduceFailed as failure:
            log.warning("round %d: worker %d's all-reduce failed: %s", round_, me, failure)
            self.failure = f"the all-reduce over {sorted([me, *members])} failed: {failure}"
        if not self._agreement.all(total is not None):  # one shard's failure: the whole group keeps its own
            total, self.failure = None, self.failure or "another shard of this worker group failed its ring"
        self.ring = tuple(groups) if total is not None else ()
        return total

    def _refresh(self, round_: int) -> None:
        """The peers' endpoints and rounds, as the control plane has them now.

        A peer the server restarted since the last look rejoins from an older
        checkpoint: for a while its updates may be rejected as too far off,
        and so may those of its neighbours, which mix its older model
        meanwhile; rejections of any peer do not count towards quarantine then
        (the server restarts a worker, a bounded number of times, so no peer
        can buy this grace).
        """
        peers = self._reporter.peers()
        self.addresses, self.rounds = peers.addresses, peers.rounds
        restarted = False
        for peer, restarts in peers.restarts.items():
            if restarts > self._restarts.setdefault(peer, restarts):
                self._restarts[peer], restarted = restarts, True
        for group in range(self._cfg.workers) if restarted else ():
            if group != self._cfg.group:
                self._quarantine.grace(self._cfg.gossip_process(group), round_)

    def _gone(self, round_: int, peers: Iterable[int]) -> Callable[[], list[int]]:
        """For an exchange of ``round_``: which of ``peers`` will not come (endpoint withdrawn, or done with it)."""

        def gone() -> list[int]:
            self._refresh(round_)
            return [p for p in peers if p not in self.addresses or self._done(p, round_)]

        return gone

    def _most_done(self, round_: int) -> bool:
        """Whether most other worker groups are done with ``round_`` before this worker: it is the late one.

        Most, not one: a peer's round is its own claim, and one peer claiming to be ahead must not switch
        this worker's screen off.
        """
        others = [self._cfg.shard_peer(g) for g in range(self._cfg.workers) if g != self._cfg.group]
        return 2 * sum(self._done(p, round_) for p in others) > len(others)

    def _done(self, peer: int, round_: int) -> bool:
        """Whether ``peer`` has finished ``round_`` (the control plane counts no round finished as round 0)."""
        return round_ > 0 and self.rounds.get(peer, 0) >= round_

    def _in_round(self, peer: int, round_: int) -> bool:
        """Whether ``peer`` has finished the round before ``round_``, and not ``round_`` itself."""
        return self.rounds.get(peer, 0) >= round_ - 1 and not self._done(peer, round_)

    def _trusted(self, peer: int) -> bool:
        group = self._cfg.gossip_process(peer // self._cfg.ranks_per_worker)  # quarantine is per group
        return peer in self.addresses and not self._quarantine.is_quarantined(group)

    def wait_for_quorum(self, round_: int, timeout: float = PEER_WAIT_S) -> None:
        """Wait (bounded) until ``min_workers`` worker groups, this one included, are in ``round_``.

        The final average must reach ``min_workers`` groups; a group the control plane is restarting
        has withdrawn its endpoint and rejoins at the job's round, so the others wait for it here
        instead of summing without it. Once every group has an endpoint, there is no one to wait for.
        """
        others = [self._cfg.shard_peer(g) for g in range(self._cfg.workers) if g != self._cfg.group]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._refresh(round_)
            if 1 + sum(self._trusted(p) and self._in_round(p, round_) for p in others) >= self._cfg.spec.min_workers:
                return
            if all(p in self.addresses for p in others):  # none away: a laggard is waited for as in any round
                return
            time.sleep(0.2)

    def _wait_for_laggards(self, round_: int, peers: list[int]) -> None:
        """Wait (bounded) until every live, trusted peer has finished the previous round.

        An all-reduce needs every member to name the same members: the
        workers in the round, which this wait lets a laggard join.
        """
        deadline = time.monotonic() + self.deadline.seconds
        while True:
            self._refresh(round_)
            behind = [p for p in peers if self._trusted(p) and self.rounds.get(p, 0) < round_ - 1]
            if not behind or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def _maybe_attack(self, round_: int, wire: torch.Tensor) -> torch.Tensor:
        """What an admin-planned attack sends instead of ``wire`` (crafted on decoded values, then encoded)."""
        if self._attack is None or not self._attack.attacks(self._cfg.group, round_):
            return wire
        theta, codec = self._outer.theta, self._outer.step.compressor.codec
        encoded, weight = split_weight(wire)
        return with_weight(codec.encode(self._crafted(codec.decode(encoded, theta.numel()))), weight)

    def _maybe_attack_mean(self, round_: int, vector: torch.Tensor) -> torch.Tensor:
        """What an admin-planned attack puts into a diloco all-reduce instead of ``[w y, w]``."""
        if self._attack is None or not self._attack.attacks(self._cfg.group, round_):
            return vector
        weight = vector[-1]
        return torch.cat([self._crafted(vector[:-1] / weight) * weight, vector[-1:]])

    def _crafted(self, y: torch.Tensor) -> torch.Tensor:
        assert self._attack is not None
        theta = self._outer.theta
        own = y - theta
        view = AttackView(
            own=own,
            honest=own[None],
            receiver=theta + own,
            honest_weights=torch.ones(1),
            byzantine_weight=0.0,
            workers=self._cfg.workers,
            byzantine=len(self._attack.workers),
        )
        return theta + craft(self._attack, view, self._noise)


def _readable(payload: torch.Tensor, sent: torch.Tensor) -> bool:
    """Whether a peer's payload has the form of this worker's own (size, dtype, a positive weight)."""
    if payload.shape != sent.shape or payload.dtype != sent.dtype:
        return False
    try:
        split_weight(payload)
    except ValueError:
        return False
    return True


class Canaries:
    """The secret canary a gasloc worker adds to each point it sends (``make_canary``, own generator).

    With a ``layout`` (a sharded group's shard) each layer gets a canary of its
    own update's scale: a shard can hold a part of a layer that barely moves
    (the embedding rows of tokens the data never uses), and a canary spread
    evenly over the whole vector would swamp that part's update, so peers would
    reject honest shards on their layer norms.
    """

    def __init__(self, seed: int, layout: LayerLayout | None = None):
        self._generator = torch.Generator().manual_seed(seed)
        self._sizes = None if layout is None else list(layout.layer_sizes)

    def __call__(self, update: torch.Tensor) -> torch.Tensor:
        if self._sizes is None:
            return make_canary(update, CANARY_SCALE, self._generator)
        return torch.cat([make_canary(part, CANARY_SCALE, self._generator) for part in update.split(self._sizes)])


class UpdateScreen:
    """The round's screen as ``GASLoCOuter`` calls it: check each decoded update, clip or drop it, report.

    The ``echo`` check looks for this worker's canary (``proposal.canary``)
    in each payload; among the rest, two peers whose pulls oppose each other
    are capped to the nearer one's distance and mixed both or neither
    (``opposition_from_gram``). A rejected or quarantined peer is treated like a
    skipped one, so the mixing stays doubly stochastic.

    Peers are named by their group's rank-0 process. With sharded groups each
    rank screens its own shard of every update (``layout``: the shard's
    layers), and the group agrees on one verdict per peer: rejected if any
    shard was, mixed only if every shard would mix it, scaled by the smallest
    clipping factor of its shards; the group's rank 0 reports the strictest
    shard's check, and every rank's quarantine records the same verdicts.

    A worker that rejoined from an older checkpoint, or fell behind, is the one that is off:
    until it has caught up (``catch_up``) it mixes whatever finite update its
    peers send, unscreened, so that it comes level with them; its peers still
    screen it, so a peer that poisons it only loses them the rejoiner.
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        reporter: Reporter,
        layout: LayerLayout,
        quarantine: Quarantine,
        agreement: GroupAgreement | None = None,
    ):
        self._cfg, self._reporter, self._quarantine = cfg, reporter, quarantine
        self._screener = UpdateScreener(layout, WORKER_SCREENING)
        self._agreement = agreement
        self._catching_up_until = 0  # the first round screened again after a rejoin

    def catch_up(self, first: int) -> None:
        """This worker rejoins at round ``first`` (restarted), or is there behind its peers (paused, slow): for a
        quarantine window it mixes their finite updates unscreened (so it neither rejects nor quarantines them for
        being where it is not yet)."""
        self._catching_up_until = max(self._catching_up_until, first + self._quarantine.policy.window)

    def __call__(self, proposal: Proposal, decoded: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        if proposal.round < self._catching_up_until:
            finite = {g for g, update in decoded.items() if bool(torch.isfinite(update).all())}
            agreed = finite if self._agreement is None else self._agreement.common(finite)
            return {g: update for g, update in decoded.items() if g in agreed}
        # the sent point less the canary: the compression error stays in (it is in the peers' points too)
        canary = proposal.canary
        anchor, own = proposal.theta, (proposal.sent if canary is None else proposal.sent - canary) - proposal.theta
        by_process = {self._cfg.gossip_process(g): update for g, update in decoded.items()}
        lenient = frozenset(p for p in by_process if self._quarantine.in_grace(p, proposal.round))
        screening = self._screener.screen_round(by_process, own, anchor=anchor, canary=canary, lenient=lenient)
        results: dict[int, ScreeningResult] = screening
        pulling = [p for p in by_process if results[p].checks[0].check != "echo"]
        opposition = opposition_from_gram(pulling, screening.pull_gram(pulling))
        accepted = opposition.whole_pairs(
            {
                p
                for p, r in results.items()
                if r.verdict is not Verdict.REJECT and not self._quarantine.is_quarantined(p)
            }
        )
        caps = {
            peer: min(caps)
            for peer, result in results.items()
            if (caps := [c for c in (result.clip_norm, opposition.caps.get(peer)) if c is not None])
        }
        factors: dict[int, float] = {}
        if self._agreement is not None:
            results, accepted, factors = self._agree(results, accepted, caps, by_process, proposal.sent)
        kept = {}
        for peer, result in results.items():
            for event in self._quarantine.record(proposal.round, result):
                if self._cfg.group_rank:  # the group's rank 0 reports for the group
                    continue
                check = max(result.checks, key=lambda c: c.verdict)
                self._reporter.anomaly(
                    peer,
                    proposal.round,
                    check.check,
                    result.verdict.name.lower(),
                    check.score,
                    quarantined=event.kind is AnomalyKind.PEER_QUARANTINED,
                )
            if peer not in accepted or self._quarantine.is_quarantined(peer):
                continue
            update = by_process[peer]
            if self._agreement is not None:
                update = proposal.sent + (update - proposal.sent) * factors[peer]
            elif peer in caps:
                update = proposal.sent + clip(update - proposal.sent, caps[peer])
            kept[peer // self._cfg.ranks_per_worker] = update
        return kept

    def _agree(
        self,
        results: dict[int, ScreeningResult],
        accepted: set[int],
        caps: dict[int, float],
        updates: dict[int, torch.Tensor],
        sent: torch.Tensor,
    ) -> tuple[dict[int, ScreeningResult], set[int], dict[int, float]]:
        """The group's verdict on each peer from every shard's (see the class docstring)."""
        assert self._agreement is not None
        mine = {}
        for peer, result in results.items():
            check = max(result.checks, key=lambda c: c.verdict)
            factor = 1.0
            if peer in caps:
                norm = (updates[peer] - sent).norm().item()
                factor = 0.0 if not math.isfinite(norm) else min(1.0, caps[peer] / norm) if norm > 0 else 1.0
            mine[peer] = (int(result.verdict), check.check, check.score, peer in accepted, factor)
        shards = self._agreement.gather(mine)
        agreed, factors = {}, {}
        for peer in results:
            views = [shard[peer] for shard in shards]
            verdict, name, score, _, _ = max(views, key=lambda v: v[0])  # the strictest shard (first on ties)
            agreed[peer] = ScreeningResult(peer, (CheckResult(name, score, Verdict(verdict)),))
            factors[peer] = min(v[4] for v in views)
        return agreed, {p for p in results if all(shard[p][3] for shard in shards)}, factors


class RefusalReports:
    """Sends the callers the gossip endpoint refused to the server, which audits them.

    At most ``per_minute`` reports a minute, so a flood of refused calls
    cannot flood the control plane; every refusal is still in the worker log.
    """

    def __init__(self, reporter: Reporter, per_minute: int = 30):
        self._reporter, self._per_minute = reporter, per_minute
        self._sent: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, address: str, principal: str, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._sent = [t for t in self._sent if now - t < 60.0]
            if len(self._sent) >= self._per_minute:
                return
            self._sent.append(now)
        try:
            self._reporter.gossip_refused(address, principal, reason)
        except grpc.RpcError as exc:  # the refusal itself stands; only its report is lost
            log.warning("could not report a refused gossip caller: %s", exc)


def wait_for_peers(reporter: Reporter, workers: int, timeout: float = PEER_WAIT_S) -> int:
    """Wait until every worker has registered its endpoint (or time out); return the job's round."""
    deadline = time.monotonic() + timeout
    while True:
        peers = reporter.peers()
        if len(peers.addresses) == workers or time.monotonic() > deadline:
            return peers.round
        time.sleep(0.2)


def sync_parameters(model: torch.nn.Module, group: dist.ProcessGroup | None) -> None:
    """Give every rank of the worker group the parameters rank 0 holds after its outer step."""
    if group is None:
        return
    flat = parameters_to_vector(model.parameters())
    dist.broadcast(flat, src=0, group=group)
    vector_to_parameters(flat, model.parameters())


def consensus(
    params: list[torch.Tensor], exchange: GossipExchange, round_: int, own_val_loss: float
) -> tuple[int, float, float] | None:
    """Average the workers' parameters (or this rank's shards of them) with one all-reduce, in place.

    Returns the number of workers averaged and the mean and standard
    deviation of their own models' validation losses; None if the all-reduce
    failed (the parameters stay this worker's).
    """
    own = flatten(params)
    exchange.wait_for_quorum(round_)
    vector = torch.cat([own, torch.tensor([own_val_loss, own_val_loss**2, 1.0])])
    # once per job, and workers arrive from their evaluations at different times: at least the first round's deadline
    total = exchange.sum(round_, vector, max(exchange.deadline.seconds, FIRST_DEADLINE_S))
    if total is None:
        return None
    count = total[-1].item()
    mean = total[:-3] / count
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(mean[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    loss_mean = total[-3].item() / count
    loss_std = math.sqrt(max(0.0, total[-2].item() / count - loss_mean**2))
    return round(count), loss_mean, loss_std


def consensus_failure(cfg: WorkerConfig, agreed: tuple[int, float, float] | None, ring: Iterable[int], why: str) -> str:
    """Why this worker's final average is no consensus of the job ("" if it is one).

    It is none if the all-reduce failed (``why`` says how), or if it reached
    fewer than ``min_workers`` worker groups (``ring``: the other groups it
    summed over): the rest were left out (dead, hung, or quarantined), so the
    graph is split and the job holds no one model.
    """
    if agreed is None:
        return f"worker {cfg.worker}: the final average failed ({why}); it holds only its own model"
    workers, needed = agreed[0], cfg.spec.min_workers
    if workers < needed:
        return (
            f"worker {cfg.worker}: the final average reached {workers} of {cfg.workers} worker groups "
            f"(with worker groups {sorted(ring)}), fewer than min_workers={needed}"
        )
    return ""


def parameters_digest(params: list[torch.Tensor]) -> str:
    """A short SHA-256 of the parameters' (or shards') bytes, so reports can show that workers hold the same model."""
    return hashlib.sha256(flatten(params).numpy().tobytes()).hexdigest()[:16]


class Decentralized:
    """The strategy of gasloc and diloco: after each round of H inner steps, an outer step over gossip.

    In a replicated group only rank 0 gossips (and holds the outer state) and
    the group's ranks follow it; in a sharded one (FSDP2 over the group's
    ranks) every rank gossips and holds the outer state of its own shard.
    Worker group 0 seals the checkpoints.
    """

    def __init__(self, cfg: WorkerConfig, reporter: Reporter):
        spec = cfg.spec
        self.cfg, self.reporter = cfg, reporter
        self.group = join_group(cfg.rendezvous, cfg.group_rank, cfg.ranks_per_worker)
        self.rank = cfg.group_rank
        self.commits = cfg.group == 0
        self.local_steps = spec.local_steps
        self.budget_s = spec.round_time_s if spec.HasField("round_time_s") else None
        self.processes = cfg.workers * cfg.ranks_per_worker
        # a sharded worker group is an FSDP2 mesh of its ranks; a replicated one holds whole models
        self.mesh: DeviceMesh | None = Parallelism.of(spec).mesh() if cfg.sharded else None
        self.data_rank, self.data_world = cfg.worker, self.processes
        self.gossips = cfg.sharded or cfg.group_rank == 0
        self.agreement = GroupAgreement(self.group if cfg.sharded else None)
        self.diloco = spec.algorithm == Algorithm.DILOCO
        self.node: GossipNode | None = None
        self.device = CPU  # gossip and its outer step run on the CPU
        self._round_ended: float | None = None  # when the last round's exchange ended: the next one's pace starts

    def params(self) -> list[torch.Tensor]:
        """What this process's outer step works on: its shards of the parameters, or the whole of them."""
        return local_shards(self.model) if self.cfg.sharded else list(self.model.parameters())

    def prepare(self, model: torch.nn.Module, state: TrainingState) -> None:
        self.model = model
        if not self.gossips:
            return
        spec, cfg = self.cfg.spec, self.cfg
        self.outer = GASLoCOuter(
            self.params(),
            make_topology(spec.topology, cfg.workers, spec.seed),
            cfg.group,
            outer_lr=spec.outer_lr,
            outer_momentum=spec.outer_momentum,
            gossip_step=spec.gossip_step if spec.HasField("gossip_step") else None,
            compression="none" if self.diloco else spec.compression,
            canary=None
            if self.diloco
            else Canaries(spec.seed + 7919 * cfg.worker, shard_layout(model) if cfg.sharded else None),
        )
        # every gossiping rank's: "outer-0" of a replicated group, "outer-RANK" for each shard of a sharded one
        state.register("outer", Scope.RANK, self.outer)

    def first_round(self, start: int) -> int:
        """Start gossiping; a restarted worker whose job went on without it catches up to the job's round."""
        cfg, first = self.cfg, start // self.local_steps
        if self.gossips:
            spec = cfg.spec
            bundle = Bundle(cfg.cert.read_bytes(), cfg.key.read_bytes(), cfg.ca.read_bytes())
            self.deadline = RoundDeadline(spec.round_deadline_s if spec.HasField("round_deadline_s") else None)
            self.node = GossipNode(
                cfg.worker,
                cfg.job_id,
                bundle,
                listen=f"{cfg.gossip_host}:0",
                deadline_s=self.deadline.seconds,
                on_refused=RefusalReports(self.reporter),
            )
            self.reporter.gossip_endpoint(self.node.start())
            quarantine = Quarantine(cfg.gossip_process(cfg.group))
            agreement = self.agreement if cfg.sharded else None
            layout = shard_layout(self.model) if cfg.sharded else LayerLayout.from_module(self.model)
            self.screen = UpdateScreen(cfg, self.reporter, layout, quarantine, agreement)
            self.exchange = GossipExchange(
                cfg, self.node, self.reporter, self.outer, quarantine, self.deadline, agreement, self.screen.catch_up
            )
            current = wait_for_peers(self.reporter, cfg.workers * (cfg.ranks_per_worker if cfg.sharded else 1))
            if current and current >= first:  # the job went on past this worker's checkpoint: it rejoins later
                first = current + 1
                if cfg.group_rank == 0:
                    self.reporter.message(f"worker {cfg.worker} rejoins at round {first} from checkpoint step {start}")
            elif start and cfg.group_rank == 0:  # resumed where the job is: level with its peers
                self.reporter.message(f"worker {cfg.worker} resumes at round {first} from checkpoint step {start}")
        first = share_from_rank0(first, self.group)
        if self.gossips and first > 0:  # its peers need not wait for it in the rounds it skips
            assert self.node is not None and self.node.address is not None
            self.reporter.gossip_endpoint(self.node.address, first_round=first)
            if first > start // self.local_steps:  # the job went on past its checkpoint: this worker is off
                self.screen.catch_up(first)
        return first

    def after_round(self, round_: int, steps_done: int) -> None:
        """The outer step (gasloc gossip or diloco all-reduce), then a replicated group's ranks take rank 0's."""
        cfg = self.cfg
        if self.gossips:
            assert self.node is not None
            exchanged = time.perf_counter()
            if self.diloco:
                stats = self.outer.round_mean(round_, self.exchange.allreduce, weight=float(steps_done))
                ring = self.exchange.ring  # not every planned peer: a dead or late worker is left out of the ring
                stats = replace(
                    stats,
                    mixed=tuple(g for g in stats.peers if g in ring),
                    skipped=tuple(g for g in stats.peers if g not in ring),
                )
            else:
                stats = self.outer.round(round_, self.exchange, self.screen, weight=float(steps_done))
            seconds = time.perf_counter() - exchanged
            self.reporter.round(  # every gossiping rank's: what its own endpoint swapped
                round_,
                [cfg.shard_peer(g) for g in stats.mixed],
                [cfg.shard_peer(g) for g in stats.skipped],
                seconds,
                inner_steps=steps_done,
                bytes_sent=self.node.bytes_sent,
                deadline_s=self.deadline.seconds,
                step_time_s=self._pace(exchanged, steps_done),
                traffic=self.exchange.take_traffic(),
            )
            self._round_ended = time.perf_counter()
            if not stats.skipped:
                self.deadline.record(seconds)
        if not cfg.sharded:
            sync_parameters(self.model, self.group)

    def _pace(self, exchanged: float, steps_done: int) -> float:
        """Mean seconds per inner step since the previous round's exchange ended (0: no previous round)."""
        if self._round_ended is None or steps_done == 0:
            return 0.0
        return (exchanged - self._round_ended) / steps_done

    def finish(self, evaluate: Callable[[], float]) -> float:
        """Average the workers' models with one all-reduce; returns the consensus's validation loss.

        A sharded group averages shard by shard (and evaluates together, as FSDP2 needs).
        """
        cfg = self.cfg
        val_loss = evaluate()
        failure = ""
        if self.gossips:
            rounds = math.ceil(cfg.spec.steps / self.local_steps)
            agreed = consensus(self.params(), self.exchange, rounds, val_loss)
            failure = consensus_failure(cfg, agreed, self.exchange.ring, self.exchange.failure)
            if agreed is not None and not failure:
                workers, own_mean, own_std = agreed
                val_loss = evaluate()
                shard = f" shard {cfg.group_rank}" if cfg.sharded else ""
                self.reporter.message(
                    f"worker {cfg.worker} holds the consensus of {workers} workers "
                    f"(parameters{shard} {parameters_digest(self.params())}): validation loss {val_loss:.4f}; "
                    f"the workers' own models {own_mean:.4f} +- {own_std:.4f}"
                )
        if not cfg.sharded:  # a replicated group's other ranks learn the outcome from its rank 0
            failure = share_from_rank0(failure, self.group)
        if failure:
            raise ConsensusFailed(failure)
        if not cfg.sharded:
            sync_parameters(self.model, self.group)
            if not self.gossips:  # the group's other ranks now hold rank 0's consensus: evaluate that
                val_loss = evaluate()
        return val_loss

    def close(self) -> None:
        if self.node is not None:
            self.node.stop()
        if self.group is not None:
            dist.destroy_process_group()
