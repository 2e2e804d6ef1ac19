"""In-process GASLoC workers, some Byzantine, run through the product's own code, for bench_anomaly.

Every part a worker runs is the product's, with a job's server defaults
(``cantata.proto.jobfields.fill_defaults`` on a gasloc ``JobSpec``): the model
(``build_model``), the inner optimizer and learning-rate schedule
(``build_optimizer``, ``Schedule``), the data (the built-in corpus and its
``BatchSampler``), the outer step (``OuterStep``: propose, then finish on what
arrived), the canaries (``Canaries``), the screening (``UpdateScreen`` with
the workers' own ``WORKER_SCREENING``) and the quarantine. Only the scale is
the benchmark's (``Scale``: fewer rounds and local steps, shorter sequences),
so that a grid runs on two CPU cores. The gossip transport is left out: a
worker's wire goes to its peers in memory.

Byzantine workers train honestly, mix what their neighbours honestly send,
and send crafted vectors per receiver (``cantata.trainer.attacks.craft``).
``undefended`` mixes whatever arrives (``finish`` without a screen);
``screened`` mixes through the workers' screen.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from cantata.proto.jobfields import FIELD, fill_defaults
from cantata.proto.v1 import common_pb2
from cantata.security.anomaly import AttackConfig, LayerLayout, Quarantine
from cantata.trainer.attacks import OWN_FRAME_ATTACKS, AttackView, craft
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data.corpus import BatchSampler, load_builtin_corpus
from cantata.trainer.decentralized import Canaries, UpdateScreen
from cantata.trainer.gasloc.outer import OuterStep, Proposal, with_weight
from cantata.trainer.gasloc.topology import Topology, make_topology
from cantata.trainer.loop import Schedule
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer, spec_settings

DEFENCES = ("undefended", "screened")


@dataclass(frozen=True)
class Scale:
    """What the benchmark sets smaller than a job's defaults; every other setting is the server's default.

    A run is the first ``rounds`` rounds of a job of the SDK's default length (``steps``), so that the
    learning-rate schedule is the one such a job has over them.
    """

    model: str = "gpt-tiny"
    workers: int = 8
    rounds: int = 6
    local_steps: int = 5
    batch_size: int = 8
    seq_len: int = 32
    val_windows: int = 32


def job_spec(scale: Scale, topology: str, seed: int) -> common_pb2.JobSpec:
    """The gasloc job the simulation runs: ``scale``, ``topology`` and ``seed`` set, the rest the server's defaults."""
    spec = common_pb2.JobSpec(
        model=scale.model,
        algorithm="gasloc",
        workers=scale.workers,
        topology=topology,
        local_steps=scale.local_steps,
        steps=FIELD["steps"].sdk_default,
        batch_size=scale.batch_size,
        seq_len=scale.seq_len,
        seed=seed,
    )
    fill_defaults(spec)
    return spec


@dataclass(frozen=True)
class RunSpec:
    topology: str
    defence: str
    attack: AttackConfig | None
    seed: int

    @property
    def byzantine(self) -> frozenset[int]:
        return self.attack.workers if self.attack else frozenset()


@dataclass
class RunResult:
    """One run's outcome; message counts cover what honest workers received (``screened`` only)."""

    val_loss: float
    byzantine_messages: int = 0
    byzantine_blocked: int = 0
    honest_messages: int = 0
    honest_blocked: int = 0
    screening_seconds: float = 0.0
    round_seconds: float = 0.0
    quarantined: list[tuple[int, int, int]] = field(default_factory=list)  # (worker, peer, round)


class Reports:
    """Stands in for a worker's control-plane reporter: the screen's anomaly reports, as quarantine events."""

    def __init__(self, worker: int, result: RunResult):
        self.worker, self.result = worker, result

    def anomaly(self, peer: int, round_: int, check: str, verdict: str, score: float, quarantined: bool) -> None:
        if quarantined:
            self.result.quarantined.append((self.worker, peer, round_))


class Worker:
    """One worker's model, optimizer, data and outer step, built as a job's worker builds them."""

    def __init__(self, spec: common_pb2.JobSpec, index: int, topology: Topology, result: RunResult, screened: bool):
        self.model = build_model(spec.model, spec.seed)
        self.optimizer = build_optimizer(
            self.model,
            spec.optimizer,
            lr=spec.lr,
            weight_decay=spec.weight_decay,
            grad_clip=spec.grad_clip,
            **spec_settings(spec),
        )
        self.schedule = Schedule.of(spec)
        self.sampler = BatchSampler(load_builtin_corpus().train, spec.batch_size, spec.seq_len, spec.seed, index)
        self.outer = OuterStep(
            topology,
            index,
            outer_lr=spec.outer_lr,
            outer_momentum=spec.outer_momentum,
            canary=Canaries(spec.seed + 7919 * index),
        )
        self.theta = parameters_to_vector(self.model.parameters()).detach().clone()
        self.screen = None
        if screened:
            cfg = WorkerConfig(  # the fields UpdateScreen reads; no server, certificates or keys are used
                job_id="sim",
                tenant="sim",
                worker=index,
                workers=spec.workers,
                attempt=0,
                server="",
                ca=Path(),
                cert=Path(),
                key=Path(),
                rendezvous="",
                threads=1,
                spec=spec,
                checkpoint_keys=None,  # type: ignore[arg-type]
                dataset_access=None,  # type: ignore[arg-type]
            )
            layout = LayerLayout.from_module(self.model)
            self.screen = UpdateScreen(cfg, Reports(index, result), layout, Quarantine(index))  # type: ignore[arg-type]

    def inner_steps(self, round_: int, steps: int) -> None:
        for k in range(steps):
            step = round_ * steps + k + 1
            self.optimizer.set_lr(self.schedule.lr(step))
            self.optimizer.zero_grad()
            batch = self.sampler.batch(step)
            _, loss = self.model(batch.inputs, batch.targets)
            loss.backward()
            self.optimizer.step()

    def propose(self, round_: int, weight: float) -> Proposal:
        return self.outer.propose(round_, self.theta, parameters_to_vector(self.model.parameters()).detach(), weight)

    def apply(self, theta_next: torch.Tensor) -> None:
        self.theta = theta_next
        vector_to_parameters(theta_next.clone(), self.model.parameters())  # the parameters become views of it

    @torch.no_grad()
    def val_loss(self, windows: torch.Tensor) -> float:
        _, loss = self.model(windows[:, :-1], windows[:, 1:])
        return float(loss)


def run(scale: Scale, spec: RunSpec) -> RunResult:
    """One run of ``spec`` at ``scale``: final validation loss of the honest workers' models (mean), and screening
    counts; ``inf`` if an honest worker's parameters stopped being finite."""
    job = job_spec(scale, spec.topology, spec.seed)
    topology = make_topology(job.topology, scale.workers, job.seed)
    result = RunResult(val_loss=math.inf)
    screened = spec.defence == "screened"
    workers = [Worker(job, i, topology, result, screened) for i in range(scale.workers)]
    byzantine = spec.byzantine
    honest = [i for i in range(scale.workers) if i not in byzantine]
    noise = torch.Generator().manual_seed(spec.seed + 1)
    weight = float(scale.local_steps)
    for round_ in range(scale.rounds):
        started = time.perf_counter()
        for worker in workers:
            worker.inner_steps(round_, scale.local_steps)
        with torch.no_grad():
            proposals = [worker.propose(round_, weight) for worker in workers]
            crafting = 0.0
            for i, worker in enumerate(workers):
                crafted_at = time.perf_counter()
                received = {
                    j: _wire(spec, round_, i, j, proposals, topology, noise, weight) for j in proposals[i].peers
                }
                crafting += time.perf_counter() - crafted_at
                screen = _counted(worker.screen, spec, round_, result) if i in honest else None
                theta_next, _ = worker.outer.finish(proposals[i], received, screen)
                worker.apply(theta_next)
        result.round_seconds += time.perf_counter() - started - crafting
        if not all(torch.isfinite(workers[i].theta).all() for i in honest):
            return result
    windows = BatchSampler(load_builtin_corpus().val, scale.val_windows, scale.seq_len, 0, 0).batch(0)
    losses = [workers[i].val_loss(torch.cat([windows.inputs, windows.targets[:, -1:]], dim=1)) for i in honest]
    result.val_loss = sum(losses) / len(losses) if all(map(math.isfinite, losses)) else math.inf
    return result


def _counted(screen: UpdateScreen | None, spec: RunSpec, round_: int, result: RunResult):
    """``screen`` (None: undefended), counting what it blocked of Byzantine and of honest messages, and its time."""
    if screen is None:
        return None

    def counting(proposal: Proposal, decoded: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        started = time.perf_counter()
        kept = screen(proposal, decoded)
        result.screening_seconds += time.perf_counter() - started
        for peer in decoded:
            if spec.attack is not None and spec.attack.attacks(peer, round_):
                result.byzantine_messages += 1
                result.byzantine_blocked += peer not in kept
            else:
                result.honest_messages += 1
                result.honest_blocked += peer not in kept
        return kept

    return counting


def _wire(
    spec: RunSpec,
    round_: int,
    receiver: int,
    sender: int,
    proposals: list[Proposal],
    topology: Topology,
    noise: torch.Generator,
    weight: float,
) -> torch.Tensor:
    """What ``sender`` sends ``receiver``: its wire, or a crafted vector with its weight if it attacks.

    Attacks on the sender's own update are crafted around its own round-start
    parameters, the omniscient ones around the receiver's. A Byzantine
    receiver gets honest wires. ALIE's n and f are those of the receiver's
    aggregation, its closed neighbourhood (the whole graph when complete).
    """
    attack = spec.attack
    if attack is None or receiver in spec.byzantine or not attack.attacks(sender, round_):
        return proposals[sender].wire
    n = len(proposals)
    neighbours = topology.neighbors(receiver, round_)
    attackers = [j for j in neighbours if j in spec.byzantine]
    observed = (
        [k for k in range(n) if k not in spec.byzantine]
        if spec.topology == "complete"
        else [receiver] + [k for k in neighbours if k not in spec.byzantine]
    )
    anchor = proposals[sender if attack.kind in OWN_FRAME_ATTACKS else receiver].theta
    sent = torch.stack([p.sent for p in proposals])
    mixing = topology.mixing_matrix(round_)
    view = AttackView(
        own=proposals[sender].sent - proposals[sender].theta,
        honest=sent[observed] - anchor,
        receiver=sent[receiver] - anchor,
        honest_weights=mixing[receiver, observed],
        byzantine_weight=sum(float(mixing[receiver, j]) for j in attackers),
        workers=len(observed) + len(attackers),
        byzantine=len(attackers),
    )
    return with_weight(anchor + craft(attack, view, noise), weight)
