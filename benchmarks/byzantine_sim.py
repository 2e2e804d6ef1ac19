"""In-process simulation of N GASLoC workers, some Byzantine, for bench_anomaly.

All workers' parameters live in one ``[N, D]`` tensor and a small char-level
GPT (2 layers, d=64) runs batched over the worker dimension, so a round of H
inner AdamW steps for every worker costs one batched forward/backward per step.
The outer round follows GASLoC: ``y = theta + eta * g``, a mix over the
topology from ``cantata.trainer.gasloc.topology``, then
``theta = z + gamma * (z - z_prev)``. Every message an honest worker receives
goes through the chosen defence; Byzantine workers train honestly, mix only
honest values, and send crafted vectors per receiver
(``cantata.trainer.attacks.craft``).

``cantata.trainer.gasloc.simulator.Simulator`` mixes inside
``OuterStep.finish`` and offers no hook for per-receiver messages or for
screening, hence this simulation of the same outer round.
"""

from __future__ import annotations

import itertools
import math
import pydoc_data.topics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cantata.security.anomaly import (
    AdaptiveRadius,
    AnomalyKind,
    AttackConfig,
    CenteredClipping,
    LayerLayout,
    Quarantine,
    QuarantinePolicy,
    ScreeningConfig,
    UpdateScreener,
    Verdict,
    WorkerMomentum,
    clipped_gossip,
    make_canary,
    multi_krum,
    opposition_from_gram,
    trimmed_mean,
)
from cantata.security.anomaly.screening import CANARY_SCALE
from cantata.trainer.attacks import OWN_FRAME_ATTACKS, AttackView, craft
from cantata.trainer.gasloc.topology import make_topology

AGGREGATOR_DEFENCES = ("trimmed_mean", "krum", "centered_clipping")


def corpus() -> tuple[torch.Tensor, int]:
    """CPython's pydoc topics as char ids, and the vocabulary size."""
    text = "".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(vocab)


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    context: int = 32
    width: int = 64
    layers: int = 2
    heads: int = 4

    def parameter_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        d = self.width
        shapes = [("embed", (self.vocab, d)), ("position", (self.context, d))]
        for k in range(self.layers):
            shapes += [
                (f"h{k}.ln1.w", (d,)),
                (f"h{k}.ln1.b", (d,)),
                (f"h{k}.qkv.w", (d, 3 * d)),
                (f"h{k}.qkv.b", (3 * d,)),
                (f"h{k}.proj.w", (d, d)),
                (f"h{k}.proj.b", (d,)),
                (f"h{k}.ln2.w", (d,)),
                (f"h{k}.ln2.b", (d,)),
                (f"h{k}.fc.w", (d, 4 * d)),
                (f"h{k}.fc.b", (4 * d,)),
                (f"h{k}.out.w", (4 * d, d)),
                (f"h{k}.out.b", (d,)),
            ]
        return [*shapes, ("lnf.w", (d,)), ("lnf.b", (d,)), ("head.w", (d, self.vocab)), ("head.b", (self.vocab,))]


class BatchedGPT:
    """A GPT whose parameters are views into a flat ``[N, D]`` tensor, one row per worker."""

    def __init__(self, shape: ModelShape):
        self.shape = shape
        self.layout = LayerLayout.from_shapes(shape.parameter_shapes())
        self.shapes = dict(shape.parameter_shapes())

    def init(self, workers: int, generator: torch.Generator) -> torch.Tensor:
        """Every worker starts from the same initialization (as a job does), drawn on the CPU."""
        flat = torch.zeros(self.layout.size)
        for name, (start, stop) in zip(self.layout.names, itertools.pairwise(self.layout.bounds), strict=True):
            if name.endswith(("ln1.w", "ln2.w", "lnf.w")):
                flat[start:stop] = 1.0
            elif name.endswith(".w") or name in ("embed", "position"):
                residual = name.endswith(("proj.w", "out.w"))
                std = 0.02 / math.sqrt(2 * self.shape.layers) if residual else 0.02
                flat[start:stop] = torch.randn(stop - start, generator=generator) * std
        return flat.repeat(workers, 1)

    def _views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """One ``split`` (its backward is one concatenation; per-slice views each add a zero-filled ``[N, D]``)."""
        n = flat.shape[0]
        parts = flat.split(self.layout.layer_sizes, dim=1)
        return {name: part.view(n, *self.shapes[name]) for name, part in zip(self.layout.names, parts, strict=True)}

    def loss(self, flat: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Per-worker mean next-char loss; ``tokens`` is ``[N, B, context + 1]``."""
        p = self._views(flat)
        n, b, _ = tokens.shape
        t, d, heads = self.shape.context, self.shape.width, self.shape.heads
        x, target = tokens[:, :, :-1], tokens[:, :, 1:]
        worker = torch.arange(n, device=flat.device)[:, None, None]
        h = p["embed"][worker, x] + p["position"][:, None, :t]
        for k in range(self.shape.layers):
            a = F.layer_norm(h, (d,)) * p[f"h{k}.ln1.w"][:, None, None] + p[f"h{k}.ln1.b"][:, None, None]
            qkv = torch.einsum("nbtd,nde->nbte", a, p[f"h{k}.qkv.w"]) + p[f"h{k}.qkv.b"][:, None, None]
            q, key, v = (z.reshape(n * b, t, heads, d // heads).transpose(1, 2) for z in qkv.split(d, dim=-1))
            att = F.scaled_dot_product_attention(q, key, v, is_causal=True).transpose(1, 2).reshape(n, b, t, d)
            h = h + torch.einsum("nbtd,nde->nbte", att, p[f"h{k}.proj.w"]) + p[f"h{k}.proj.b"][:, None, None]
            a = F.layer_norm(h, (d,)) * p[f"h{k}.ln2.w"][:, None, None] + p[f"h{k}.ln2.b"][:, None, None]
            a = F.gelu(torch.einsum("nbtd,nde->nbte", a, p[f"h{k}.fc.w"]) + p[f"h{k}.fc.b"][:, None, None])
            h = h + torch.einsum("nbte,ned->nbtd", a, p[f"h{k}.out.w"]) + p[f"h{k}.out.b"][:, None, None]
        h = F.layer_norm(h, (d,)) * p["lnf.w"][:, None, None] + p["lnf.b"][:, None, None]
        logits = torch.einsum("nbtd,ndv->nbtv", h, p["head.w"]) + p["head.b"][:, None, None]
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
        return losses.view(n, -1).mean(dim=1)


@dataclass(frozen=True)
class Setup:
    """Training settings shared by every run of a benchmark."""

    workers: int = 8
    rounds: int = 10
    inner_steps: int = 8
    batch: int = 8
    inner_lr: float = 3e-3
    outer_lr: float = 1.0
    outer_momentum: float = 0.5
    cc_momentum: float = 0.5
    val_windows: int = 64


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
    """One run's outcome; message counts cover what honest workers received."""

    val_loss: float
    byzantine_messages: int = 0
    byzantine_blocked: int = 0
    byzantine_clipped: int = 0
    honest_messages: int = 0
    honest_blocked: int = 0
    honest_clipped: int = 0
    screening_seconds: float = 0.0
    round_seconds: float = 0.0
    # the same two in this thread's CPU time, which other processes' load does not inflate
    screening_cpu_seconds: float = 0.0
    round_cpu_seconds: float = 0.0
    quarantined: list[tuple[int, int, int]] = field(default_factory=list)  # (worker, peer, round)


class Simulation:
    """Runs one ``RunSpec`` of GASLoC with the benchmark's model and data.

    On ``device`` (``cpu`` or ``cuda``): the data, the parameters and every
    vector exchanged live there. Random draws (initialization, batches,
    canaries, attack noise) come from CPU generators and are moved, so a
    run draws the same numbers on any device and the CPU path is unchanged.
    """

    def __init__(
        self, setup: Setup, screening: ScreeningConfig, quarantine: QuarantinePolicy, device: str | torch.device = "cpu"
    ):
        self.setup = setup
        self.screening = screening
        self.quarantine_policy = quarantine
        self.device = torch.device(device)
        self.tokens, vocab = corpus()
        self.tokens = self.tokens.to(self.device)
        self.model = BatchedGPT(ModelShape(vocab))
        split = int(0.9 * len(self.tokens))
        self.train, self.val = self.tokens[:split], self.tokens[split:]

    def tolerated(self, topology: str) -> int:
        """Byzantine neighbours each defence is set to tolerate: 1 on the ring, 2 otherwise."""
        return 1 if topology == "ring" else 2

    def _batch(self, generator: torch.Generator) -> torch.Tensor:
        n, b, span = self.setup.workers, self.setup.batch, self.model.shape.context + 1
        shard = (len(self.train) - span) // n
        starts = torch.randint(0, shard, (n, b), generator=generator) + torch.arange(n)[:, None] * shard
        return self.train[(starts[..., None] + torch.arange(span)).to(self.device)]

    def _val_loss(self, theta: torch.Tensor, honest: list[int]) -> float:
        span = self.model.shape.context + 1
        starts = torch.linspace(0, len(self.val) - span - 1, self.setup.val_windows).long()
        windows = self.val[(starts[:, None] + torch.arange(span)).to(self.device)]
        with torch.no_grad():
            losses = self.model.loss(theta[honest], windows.expand(len(honest), -1, -1))
        return losses.mean().item() if torch.isfinite(losses).all() else math.inf

    def run(self, spec: RunSpec) -> RunResult:
        setup, n = self.setup, self.setup.workers
        generator = torch.Generator().manual_seed(spec.seed)
        attack_noise = torch.Generator().manual_seed(spec.seed + 1)
        canaries = torch.Generator().manual_seed(spec.seed + 2)
        topology = make_topology(spec.topology, n, seed=spec.seed)
        byzantine = spec.byzantine
        honest = [i for i in range(n) if i not in byzantine]
        tolerated = self.tolerated(spec.topology)
        params = self.model.init(n, generator).to(self.device).requires_grad_()
        optimizer = torch.optim.AdamW([params], lr=setup.inner_lr, weight_decay=0.0)
        z_previous = params.detach().clone()
        screeners = {i: UpdateScreener(self.model.layout, self.screening) for i in honest}
        quarantines = {i: Quarantine(i, self.quarantine_policy) for i in honest}
        centered = {i: CenteredClipping(radius=None) for i in honest}
        momenta = {i: WorkerMomentum(setup.cc_momentum) for i in range(n)}
        result = RunResult(val_loss=math.inf)

        for round in range(setup.rounds):
            started, started_cpu = time.perf_counter(), time.thread_time()
            theta = params.detach().clone()
            for _ in range(setup.inner_steps):
                optimizer.zero_grad(set_to_none=True)
                self.model.loss(params, self._batch(generator)).sum().backward()
                optimizer.step()
            with torch.no_grad():
                y = theta + setup.outer_lr * (params.detach() - theta)
                if spec.defence == "centered_clipping":
                    sent = torch.stack([theta[j] + momenta[j].update(y[j] - theta[j]) for j in range(n)])
                elif spec.defence == "screened":  # each worker sends its point plus a secret canary (echo check)
                    canaried_at, canaried_cpu = time.perf_counter(), time.thread_time()
                    sent = y + torch.stack([make_canary(y[j] - theta[j], CANARY_SCALE, canaries) for j in range(n)])
                    result.screening_seconds += time.perf_counter() - canaried_at  # the canaries are the screening's
                    result.screening_cpu_seconds += time.thread_time() - canaried_cpu
                else:
                    sent = y
                mixing = topology.mixing_matrix(round).to(self.device, torch.float32)
                z = torch.empty_like(y)
                crafting = crafting_cpu = 0.0
                for i in honest:
                    neighbours = topology.neighbors(i, round)
                    crafted_at, crafted_cpu = time.perf_counter(), time.thread_time()
                    messages = {
                        j: self._message(spec, round, i, j, neighbours, theta, sent, mixing, attack_noise)
                        for j in neighbours
                    }
                    crafting += time.perf_counter() - crafted_at
                    crafting_cpu += time.thread_time() - crafted_cpu
                    z[i] = self._defend(
                        spec,
                        round,
                        i,
                        theta[i],
                        y[i],
                        sent[i],
                        messages,
                        mixing,
                        tolerated,
                        screeners,
                        quarantines,
                        centered,
                        result,
                    )
                for b in byzantine:
                    z[b] = y[b] + sum(mixing[b, j] * (y[j] - y[b]) for j in topology.neighbors(b, round))
                theta_next = z + setup.outer_momentum * (z - z_previous)
                z_previous = z
                params.copy_(theta_next)
            result.round_seconds += time.perf_counter() - started - crafting
            result.round_cpu_seconds += time.thread_time() - started_cpu - crafting_cpu
            if not torch.isfinite(theta_next[honest]).all():
                return result
        result.val_loss = self._val_loss(params.detach(), honest)
        return result

    def _message(self, spec, round, receiver, sender, neighbours, theta, sent, mixing, noise) -> torch.Tensor:
        """What ``sender`` sends ``receiver``: its value, or a crafted one if it attacks.

        Attacks on the sender's own update are crafted around its own
        round-start parameters; the omniscient ones around the receiver's.
        ALIE's n and f are those of the receiver's aggregation, which in
        gossip is its closed neighbourhood: the receiver, its honest
        neighbours and its Byzantine ones (the whole graph when complete).
        """
        if spec.attack is None or not spec.attack.attacks(sender, round):
            return sent[sender]
        n = len(sent)
        attackers = [j for j in neighbours if j in spec.byzantine]
        if spec.topology == "complete":
            observed = [k for k in range(n) if k not in spec.byzantine]
        else:
            observed = [receiver] + [k for k in neighbours if k not in spec.byzantine]
        anchor = theta[sender] if spec.attack.kind in OWN_FRAME_ATTACKS else theta[receiver]
        view = AttackView(
            own=sent[sender] - anchor,
            honest=sent[observed] - anchor,
            receiver=sent[receiver] - anchor,
            honest_weights=mixing[receiver, observed],
            byzantine_weight=sum(mixing[receiver, j].item() for j in neighbours if j in spec.byzantine),
            workers=len(observed) + len(attackers),
            byzantine=len(attackers),
        )
        return anchor + craft(spec.attack, view, noise)

    def _defend(
        self,
        spec,
        round,
        i,
        theta_i,
        y_i,
        sent_i,
        messages,
        mixing,
        tolerated,
        screeners,
        quarantines,
        centered,
        result,
    ) -> torch.Tensor:
        """Worker i's mixed point z_i under the run's defence."""
        defence = spec.defence
        if defence == "undefended":
            return y_i + sum(mixing[i, j] * (m - y_i) for j, m in messages.items())
        if defence in AGGREGATOR_DEFENCES:
            rows = torch.stack([sent_i - theta_i] + [m - theta_i for m in messages.values()])
            if defence == "trimmed_mean":
                return theta_i + trimmed_mean(rows, tolerated)
            if defence == "krum":
                return theta_i + multi_krum(rows, tolerated, selected=1)
            return theta_i + centered[i](rows)
        screened_at, screened_cpu = time.perf_counter(), time.thread_time()
        open_peers = [j for j in messages if not quarantines[i].is_quarantined(j)]
        screenings = screeners[i].screen_round(
            {j: messages[j] for j in open_peers}, y_i - theta_i, anchor=theta_i, canary=sent_i - y_i
        )
        pulling = [j for j in open_peers if screenings[j].checks[0].check != "echo"]
        opposition = opposition_from_gram(pulling, screenings.pull_gram(pulling))
        accepted = set()
        for j in open_peers:
            events = quarantines[i].record(round, screenings[j])
            result.quarantined += [(i, j, round) for e in events if e.kind is AnomalyKind.PEER_QUARANTINED]
            if screenings[j].verdict is not Verdict.REJECT:
                accepted.add(j)
        accepted = opposition.whole_pairs(accepted)
        kept, caps = [], []
        for j, message in messages.items():
            verdict = Verdict.REJECT
            if j in accepted:
                verdict = screenings[j].verdict
                kept.append(message)
                limits = [c for c in (screenings[j].clip_norm, opposition.caps.get(j)) if c is not None]
                caps.append(min(limits) if limits else None)
            if j in spec.byzantine and spec.attack.attacks(j, round):
                result.byzantine_messages += 1
                result.byzantine_blocked += verdict is Verdict.REJECT
                result.byzantine_clipped += verdict is Verdict.CLIP
            else:
                result.honest_messages += 1
                result.honest_blocked += verdict is Verdict.REJECT
                result.honest_clipped += verdict is Verdict.CLIP
        result.screening_seconds += time.perf_counter() - screened_at
        result.screening_cpu_seconds += time.thread_time() - screened_cpu
        step = mixing[i, next(iter(messages))].item()
        # ClippedGossip's radius bounds b liars among at least 2b + 1 neighbours; among fewer (the ring's
        # two) it would clip an honest neighbour every round, and the echo and opposition checks bound them
        radius = AdaptiveRadius(tolerated if len(messages) > 2 * tolerated else 0)
        # differences from the point it sent (canary included), so the workers' mean is kept
        return y_i - sent_i + clipped_gossip(sent_i, kept, [1.0] * len(kept), step, radius, caps)
