"""Decentralized training of one worker: GASLoC gossip, and DiLoCo over a ring all-reduce.

Each worker trains its own copy of the model for H local steps (or, with
``round_time_s``, as many as fit in that time), then runs one outer round: it
proposes y = theta_t + eta * g and either swaps y with this round's peers over
its mutual-TLS gossip endpoint and screens what it received (gasloc), or
averages y, weighted by inner steps done, with every worker by a ring
all-reduce over the same endpoints (diloco); then it applies the accelerated
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
processes training one model data-parallel (gradients averaged over their
own ``torch.distributed`` group, Canzona for Muon). Only the group's rank 0
gossips; after each outer round it broadcasts the new parameters to its
ranks. Topologies are over groups; on the wire (gossip identities, peers and
rounds from the control plane, reports) a group is its rank-0 process.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
import threading
import time
from contextlib import closing
from dataclasses import dataclass

import grpc
import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from cantata.proto.jobfields import MAX_WORKERS
from cantata.proto.vocabulary import Algorithm, Compression
from cantata.security.anomaly.attack_policy import SpecOrigin, parse_attack_config
from cantata.security.anomaly.clipping import clip
from cantata.security.anomaly.quarantine import AnomalyKind, Quarantine
from cantata.security.anomaly.screening import LayerLayout, ScreeningConfig, UpdateScreener, Verdict
from cantata.security.pki import Bundle
from cantata.trainer.attacks import AttackView, craft
from cantata.trainer.checkpoint import JobCheckpoints
from cantata.trainer.config import WorkerConfig
from cantata.trainer.gasloc.deadline import FIRST_DEADLINE_S, RoundDeadline
from cantata.trainer.gasloc.outer import GASLoCOuter, Proposal, flatten
from cantata.trainer.gasloc.topology import make_topology
from cantata.trainer.gossip import GossipNode
from cantata.trainer.gossip.allreduce import AllReduceFailed, ring_allreduce
from cantata.trainer.loop import (
    Schedule,
    Stopped,
    evaluate,
    job_feed,
    log_checkpoint,
    log_eval,
    log_progress,
    report_data_wait,
    train_step,
)
from cantata.trainer.model import GPT, build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.reporter import Reporter

PEER_WAIT_S = 60.0
SUBROUNDS = 2 * MAX_WORKERS  # wire rounds per outer round: room for every swap of a ring all-reduce
log = logging.getLogger(__name__)
# Real jobs mix few, short rounds: a layer's share of the distance varies more
# than in the benchmark's simulation, so its spread is floored higher (honest
# peers were otherwise rejected on layer norms late in training).
WORKER_SCREENING = ScreeningConfig(layer_min_spread=0.3)  # at start, for the other workers' gossip endpoints


def wire_round(round_: int, step: int = 0) -> int:
    """The transport's round number of swap ``step`` of outer round ``round_`` (it must only grow)."""
    return round_ * SUBROUNDS + step


class GossipExchange:
    """The round's exchanges as ``GASLoCOuter`` calls them: wait for laggards, then swap over gossip.

    ``__call__`` swaps wires with the round's peers (gasloc); ``allreduce`` sums
    a vector over every live worker by a ring all-reduce (diloco, and the
    final consensus). Peers are worker groups; on the wire a group is its
    rank-0 process. Quarantined peers are not dialled.
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        node: GossipNode,
        reporter: Reporter,
        outer: GASLoCOuter,
        quarantine: Quarantine,
        deadline: RoundDeadline,
    ):
        self._cfg, self._node, self._reporter, self._outer = cfg, node, reporter, outer
        self._quarantine, self.deadline = quarantine, deadline
        self._attack = parse_attack_config(cfg.attack, SpecOrigin.ADMIN) if cfg.attack else None
        self._noise = torch.Generator().manual_seed(cfg.spec.seed + cfg.worker)
        self._wire_dtype = torch.bfloat16 if cfg.spec.compression == Compression.BF16 else None
        self.addresses: dict[int, str] = {}
        self.rounds: dict[int, int] = {}  # each worker's latest finished round, as the control plane last said

    def __call__(self, round_: int, groups: list[int], wire: torch.Tensor) -> dict[int, torch.Tensor]:
        """Exchange with the worker groups ``groups``; returns the wire each one whose edge was used sent."""
        peers = [self._cfg.gossip_process(g) for g in groups]
        sent = self._maybe_attack(round_, wire)
        self._wait_for_laggards(round_, peers)
        wanted = {p: self.addresses[p] for p in peers if self._trusted(p)}
        received = self._node.exchange(wire_round(round_), wanted, sent, deadline_s=self.deadline.seconds)
        return {peer // self._cfg.ranks_per_worker: t.clone() for peer, t in received.items()}

    def allreduce(self, round_: int, vector: torch.Tensor) -> torch.Tensor | None:
        """A diloco round's all-reduce of ``[w y, w]`` (an admin-planned attack replaces y first)."""
        return self.sum(round_, self._maybe_attack_mean(round_, vector))

    def sum(self, round_: int, vector: torch.Tensor, deadline_s: float | None = None) -> torch.Tensor | None:
        """The sum of ``vector`` over every live, trusted worker by a ring all-reduce; None if it failed.

        The ring is every trusted worker that finished the previous round
        (after the bounded wait for laggards), so a dead worker drops out of it
        once the others have moved on. One deadline (the round's, unless
        ``deadline_s`` says otherwise) covers the whole all-reduce.
        """
        me = self._cfg.worker
        others = [self._cfg.gossip_process(g) for g in range(self._cfg.workers) if g != self._cfg.group]
        self._wait_for_laggards(round_, others)
        members = sorted([me] + [p for p in others if self._trusted(p) and self.rounds.get(p, 0) >= round_ - 1])
        end = time.monotonic() + (self.deadline.seconds if deadline_s is None else deadline_s)

        def swap(step: int, payloads):
            addresses = {p: self.addresses[p] for p in payloads}
            left = max(0.0, end - time.monotonic())
            return self._node.exchange(wire_round(round_, step), addresses, payloads, deadline_s=left)

        try:
            return ring_allreduce(vector, members, me, swap, self._wire_dtype)
        except AllReduceFailed as failure:
            log.warning("round %d: worker %d's all-reduce failed: %s", round_, me, failure)
            return None

    def _trusted(self, peer: int) -> bool:
        return peer in self.addresses and not self._quarantine.is_quarantined(peer)

    def _wait_for_laggards(self, round_: int, peers: list[int]) -> None:
        """Keep rounds aligned: wait (bounded) until every live, trusted peer has finished the previous round.

        Without this, a worker that a dead peer held back for a whole deadline
        falls one round behind its neighbours and their exchanges keep missing.
        """
        deadline = time.monotonic() + self.deadline.seconds
        while True:
            self.addresses, _, self.rounds = self._reporter.peers()
            behind = [p for p in peers if self._trusted(p) and self.rounds.get(p, 0) < round_ - 1]
            if not behind or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def _maybe_attack(self, round_: int, wire: torch.Tensor) -> torch.Tensor:
        """What an admin-planned attack sends instead of ``wire`` (crafted on decoded values, then encoded)."""
        if self._attack is None or not self._attack.attacks(self._cfg.group, round_):
            return wire
        theta, codec = self._outer.theta, self._outer.step.compressor.codec
        return codec.encode(self._crafted(codec.decode(wire, theta.numel())))

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


class UpdateScreen:
    """The round's screen as ``GASLoCOuter`` calls it: check each decoded update, clip or drop it, report.

    A rejected or quarantined peer is treated like a skipped one, so the
    mixing stays doubly stochastic.
    """

    def __init__(self, cfg: WorkerConfig, reporter: Reporter, model: torch.nn.Module, quarantine: Quarantine):
        self._cfg, self._reporter, self._quarantine = cfg, reporter, quarantine
        self._screener = UpdateScreener(LayerLayout.from_module(model), WORKER_SCREENING)

    def __call__(self, proposal: Proposal, decoded: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        anchor, own = proposal.theta, proposal.sent - proposal.theta
        by_process = {self._cfg.gossip_process(g): update for g, update in decoded.items()}
        kept = {}
        for peer, result in self._screener.screen_round(by_process, own, anchor=anchor).items():
            for event in self._quarantine.record(proposal.round, result):
                check = max(result.checks, key=lambda c: c.verdict)
                self._reporter.anomaly(
                    peer,
                    proposal.round,
                    check.check,
                    result.verdict.name.lower(),
                    check.score,
                    quarantined=event.kind is AnomalyKind.PEER_QUARANTINED,
                )
            if result.verdict is Verdict.REJECT or self._quarantine.is_quarantined(peer):
                continue
            update = by_process[peer]
            if result.verdict is Verdict.CLIP and result.clip_norm is not None:
                update = proposal.sent + clip(update - proposal.sent, result.clip_norm)
            kept[peer // self._cfg.ranks_per_worker] = update
        return kept


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
        addresses, current, _ = reporter.peers()
        if len(addresses) == workers or time.monotonic() > deadline:
            return current
        time.sleep(0.2)


def join_worker_group(cfg: WorkerConfig) -> dist.ProcessGroup | None:
    """The ``torch.distributed`` group of this process's worker group (None for a one-process worker)."""
    if cfg.ranks_per_worker == 1:
        return None
    dist.init_process_group(
        "gloo",
        init_method=cfg.rendezvous,
        rank=cfg.group_rank,
        world_size=cfg.ranks_per_worker,
        timeout=dt.timedelta(minutes=5),
    )
    return dist.group.WORLD


def share_from_rank0(value: int, group: dist.ProcessGroup | None) -> int:
    """Rank 0's ``value`` on every rank of the worker group."""
    if group is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def sync_parameters(model: torch.nn.Module, group: dist.ProcessGroup | None) -> None:
    """Give every rank of the worker group the parameters rank 0 holds after its outer step."""
    if group is None:
        return
    flat = parameters_to_vector(model.parameters())
    dist.broadcast(flat, src=0, group=group)
    vector_to_parameters(flat, model.parameters())


def inner_steps(
    model: GPT,
    optimizer,
    feed,
    schedule: Schedule,
    plan: RoundPlan,
    t: int,
    should_stop,
    group: dist.ProcessGroup | None,
) -> tuple[int, float]:
    """Round ``t``'s inner steps: ``local_steps`` of them, or as many as fit in the time budget (at least one).

    The learning rate follows the nominal step ``t * H + h + 1``, held at the
    round's last one for steps past H. Returns the steps done and the last loss.
    """
    began = time.perf_counter()
    done = 0
    while True:
        if should_stop():
            raise Stopped()
        step = t * plan.local_steps + min(done, plan.local_steps - 1) + 1
        lr = schedule.lr(min(step, plan.steps))
        loss = train_step(model, optimizer, feed, step, lr, accumulate=plan.accumulate, trace=plan.trace)
        done += 1
        if plan.budget_s is None:
            more = done < plan.local_steps
        else:  # stop unless one more step at the mean pace so far fits; a group's ranks follow rank 0
            elapsed = time.perf_counter() - began
            more = bool(share_from_rank0(int(elapsed * (done + 1) / done <= plan.budget_s), group))
        if not more:
            return done, loss


@dataclass(frozen=True)
class RoundPlan:
    local_steps: int  # H: nominal inner steps per round (rounds = ceil(steps / H))
    steps: int
    budget_s: float | None  # round_time_s: inner steps run for this long instead of H of them
    trace: bool
    accumulate: int = 1  # grad_accum: micro-batches per inner step


def consensus(
    model: torch.nn.Module, exchange: GossipExchange, round_: int, own_val_loss: float
) -> tuple[int, float, float] | None:
    """Average the workers' parameters with one all-reduce and load the average into ``model``.

    Returns the number of workers averaged and the mean and standard
    deviation of their own models' validation losses; None if the all-reduce
    failed (the model keeps this worker's parameters).
    """
    params = list(model.parameters())
    own = flatten(params)
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


def parameters_digest(model: torch.nn.Module) -> str:
    """A short SHA-256 of the parameters' bytes, so reports can show that workers hold the same model."""
    return hashlib.sha256(flatten(model.parameters()).numpy().tobytes()).hexdigest()[:16]


def train_decentralized(cfg: WorkerConfig, reporter: Reporter, stop: threading.Event) -> float:
    """Train to ``spec.steps`` in rounds of H local steps, then average; returns the consensus's validation loss."""
    spec = cfg.spec
    torch.set_num_threads(cfg.threads)
    group = join_worker_group(cfg)
    local_steps = spec.local_steps
    plan = RoundPlan(
        local_steps,
        spec.steps,
        spec.round_time_s if spec.HasField("round_time_s") else None,
        spec.trace_samples,
        spec.grad_accum,
    )
    diloco = spec.algorithm == Algorithm.DILOCO
    model = build_model(spec.model, spec.seed)
    seq_len = min(spec.seq_len, model.cfg.block_size)
    optimizer = build_optimizer(
        model,
        spec.optimizer,
        lr=spec.lr,
        weight_decay=spec.weight_decay,
        grad_clip=spec.grad_clip,
        process_group=group,
    )
    schedule = Schedule.of(spec)
    lead = cfg.worker == 0  # reports progress for the job
    gossips = cfg.group_rank == 0
    saves = cfg.group == 0  # worker group 0 writes the checkpoints, each rank its optimizer state

    with closing(job_feed(cfg, reporter, seq_len, rank=cfg.worker, world=cfg.workers * cfg.ranks_per_worker)) as feed:
        checkpoints = JobCheckpoints(spec.checkpoint_store, cfg.tenant, cfg.job_id, cfg.checkpoint_keys, spec.keep_last)
        start = share_from_rank0(checkpoints.latest_step() or 0, group)
        if start:
            shards = checkpoints.load(start)
            model.load_state_dict(shards["model"])
            optimizer.load_state_dict(shards[f"optim-{cfg.group_rank}"])
        node = None
        first_round = start // local_steps
        if gossips:
            outer = GASLoCOuter(
                model.parameters(),
                make_topology(spec.topology, cfg.workers, spec.seed),
                cfg.group,
                outer_lr=spec.outer_lr,
                outer_momentum=spec.outer_momentum,
                gossip_step=spec.gossip_step if spec.HasField("gossip_step") else None,
                compression="none" if diloco else spec.compression,
            )
            if start:
                outer.load_state_dict(shards["outer-0"])
            bundle = Bundle(cfg.cert.read_bytes(), cfg.key.read_bytes(), cfg.ca.read_bytes())
            deadline = RoundDeadline(spec.round_deadline_s if spec.HasField("round_deadline_s") else None)
            node = GossipNode(
                cfg.worker,
                cfg.job_id,
                bundle,
                listen=f"{cfg.gossip_host}:0",
                deadline_s=deadline.seconds,
                on_refused=RefusalReports(reporter),
            )
            reporter.gossip_endpoint(node.start())
            quarantine = Quarantine(cfg.worker)
            exchange = GossipExchange(cfg, node, reporter, outer, quarantine, deadline)
            screen = UpdateScreen(cfg, reporter, model, quarantine)
            current = wait_for_peers(reporter, cfg.workers)
            if current:  # a restarted worker: the job went on without it, so catch up
                first_round = max(first_round, current + 1)
                reporter.message(f"worker {cfg.worker} rejoins at round {first_round} from checkpoint step {start}")
            elif start and lead:
                reporter.message(f"resumed from checkpoint at step {start}")
        first_round = share_from_rank0(first_round, group)

        rounds = math.ceil(spec.steps / local_steps)
        tokens_per_step = spec.batch_size * seq_len * spec.grad_accum * cfg.workers * cfg.ranks_per_worker
        val_loss = float("nan")
        resumes_at_checkpoint = start and start == first_round * local_steps
        position = checkpoints.load_position(start, cfg.worker) if resumes_at_checkpoint else None
        if position is not None:
            feed.load_state_dict(position)
        elif first_round:  # rejoining later than the checkpoint (or it holds no position): that round's first batch
            feed.seek(first_round * local_steps * spec.grad_accum)

        def save(step: int) -> None:
            checkpoints.save_position(step, cfg.worker, feed.state_dict())
            if not saves:
                return
            shards = {f"optim-{cfg.group_rank}": optimizer.state_dict()}
            if gossips:
                shards.update({"model": model.state_dict(), "outer-0": outer.state_dict()})
            size = checkpoints.save(step, cfg.group_rank, shards, group)
            if lead:
                assert size is not None  # the lead is rank 0, which commits
                log_checkpoint(step, size, spec.keep_last)
                reporter.checkpoint(step, spec.checkpoint_store, size)

        try:
            began = time.perf_counter()
            for t in range(first_round, rounds):
                tick = time.perf_counter()
                done, loss = inner_steps(
                    model, optimizer, feed, schedule, plan, t, lambda: stop.is_set() or reporter.stop_requested, group
                )
                if gossips:
                    exchanged = time.perf_counter()
                    if diloco:
                        stats = outer.round_mean(t, exchange.allreduce, weight=float(done))
                    else:
                        stats = outer.round(t, exchange, screen)
                    seconds = time.perf_counter() - exchanged
                    reporter.round(
                        t,
                        [cfg.gossip_process(g) for g in stats.mixed],
                        [cfg.gossip_process(g) for g in stats.skipped],
                        seconds,
                        inner_steps=done,
                        bytes_sent=node.bytes_sent if node is not None else 0,
                        deadline_s=deadline.seconds,
                    )
                    if not stats.skipped:
                        deadline.record(seconds)
                sync_parameters(model, group)
                step = min((t + 1) * local_steps, spec.steps)
                tokens_per_s = tokens_per_step * done / (time.perf_counter() - tick)
                log_progress(step, spec.steps, loss, schedule.lr(step), tokens_per_s, optimizer.last_grad_norm)
                if lead:
                    reporter.progress(step, loss, tokens_per_s, schedule.lr(step))
                if step == spec.steps:
                    break  # the last round's model is evaluated and saved as the consensus, below
                if step // spec.eval_every > (step - local_steps) // spec.eval_every:
                    val_loss = evaluate(model, feed, spec.eval_batches)
                    log_eval(step, val_loss)
                    if lead:
                        reporter.eval(step, val_loss)
                if step // spec.checkpoint_every > (step - local_steps) // spec.checkpoint_every:
                    save(step)
            val_loss = evaluate(model, feed, spec.eval_batches)
            if gossips:
                agreed = consensus(model, exchange, rounds, val_loss)
                if agreed is None:
                    reporter.message(f"worker {cfg.worker}: the final average failed; it keeps its own model")
                else:
                    workers, own_mean, own_std = agreed
                    val_loss = evaluate(model, feed, spec.eval_batches)
                    reporter.message(
                        f"worker {cfg.worker} holds the consensus of {workers} workers "
                        f"(parameters {parameters_digest(model)}): validation loss {val_loss:.4f}; "
                        f"the workers' own models {own_mean:.4f} +- {own_std:.4f}"
                    )
            sync_parameters(model, group)
            if lead:
                reporter.eval(spec.steps, val_loss)
            save(spec.steps)
            if lead:
                report_data_wait(reporter, feed, time.perf_counter() - began)
            return val_loss
        finally:
            if node is not None:
                node.stop()
            if group is not None:
                dist.destroy_process_group()
