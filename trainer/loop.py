"""The one trainer of a worker process, for every algorithm.

Every process builds the same model from the job's seed, reads its own
batches from the job's data feed and runs rounds of inner optimizer steps (the
optimizer synchronises gradients over the strategy's process group). A
:class:`Strategy` says what a round is and what follows it: :class:`AllReduce`
(single and allreduce jobs) has rounds of one step and nothing after them;
:class:`~cantata.trainer.decentralized.Decentralized` (gasloc, diloco) has
rounds of H steps followed by a gossip or all-reduce outer step, and a final
consensus. What a checkpoint holds is one :class:`TrainingState` registry:
the model, the optimizer, the data position, and whatever the strategy adds.
A resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from cantata.proto.faults import Fault
from cantata.proto.jobfields import server_default
from cantata.proto.vocabulary import DECENTRALIZED, LrSchedule, MixedPrecision
from cantata.security.sealed_checkpoint import SHARDED_PART
from cantata.storage import uri as stores
from cantata.trainer.async_checkpoint import AsyncSaver, Committed
from cantata.trainer.checkpoint import JobCheckpoints, Scope, TrainingState, share_from_rank0
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data import DataEvent, Feed, Utf8Policy, Vocabulary, open_feed
from cantata.trainer.device import Device, pick_device
from cantata.trainer.float8 import check_float8_device, convert_to_float8
from cantata.trainer.model import LanguageModel, build_model
from cantata.trainer.models import family_of_module
from cantata.trainer.optim import build_optimizer, spec_settings
from cantata.trainer.parallel import MeshState, Parallelism, build_sharded, data_rank
from cantata.trainer.pipeline import Pipeline, PipelineState
from cantata.trainer.recovery import Recovery, RecoveryPolicy, Trip
from cantata.trainer.regional_compile import compile_blocks
from cantata.trainer.reporter import Reporter
from cantata.trainer.weights import load_weights, open_weights


class Stopped(Exception):
    """The job was cancelled or the server asked the worker to stop."""


class LossTripped(Exception):
    """The loss of ``step`` tripped the job's recovery policy (on every rank alike): roll back."""

    def __init__(self, step: int, trip: Trip):
        super().__init__(f"step {step}: {trip.cause}")
        self.step, self.trip = step, trip


DEFAULT_SCHEDULE, DEFAULT_MIN_RATIO = LrSchedule(server_default("lr_schedule")), server_default("min_lr_ratio")


@dataclass(frozen=True)
class Schedule:
    """Linear warm-up from 0 to ``peak``, then cosine or linear decay (or none) to ``min_ratio`` x ``peak``."""

    peak: float
    steps: int
    warmup: int
    kind: LrSchedule = DEFAULT_SCHEDULE
    min_ratio: float = DEFAULT_MIN_RATIO

    @classmethod
    def of(cls, spec) -> Schedule:
        """The schedule a parsed ``JobSpec`` asks for (the server filled its defaults in)."""
        return cls(spec.lr, spec.steps, spec.warmup_steps, LrSchedule(spec.lr_schedule), spec.min_lr_ratio)

    def lr(self, step: int) -> float:
        if step <= self.warmup:
            return self.peak * step / self.warmup
        if self.kind is LrSchedule.CONSTANT:
            return self.peak
        progress = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        if self.kind is LrSchedule.LINEAR:
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1 + math.cos(math.pi * progress))
        return self.peak * (self.min_ratio + (1 - self.min_ratio) * decay)


log = logging.getLogger("cantata.worker")
CPU = Device("cpu")
# datasets whose validation split is read when the job starts
LOCAL_DATASETS = ("builtin:", stores.SCHEMES[stores.LOCAL].prefix)


def visible_devices() -> str:
    """What the executor gave this worker: its CUDA_VISIBLE_DEVICES."""
    return f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}"


def note(event: str, message: str, *, level: int = logging.INFO, **fields: object) -> None:
    """A line of the worker's log (what ``cantata jobs logs`` shows); ``fields`` are the JSON form's keys."""
    log.log(level, message, extra={"fields": {"event": event, **fields}})


class ReportedOutages:
    """A checkpoint store's outage as the job shows it: a job event and a log line when it begins and when it ends."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = reporter

    def unreachable(self, store: str, cause: str, retry_for: float) -> None:
        note("store_unreachable", f"checkpoint store {store} unreachable ({cause}); retrying for up to {retry_for:g} s")
        self._reporter.store_unreachable(store, cause, retry_for)

    def reachable(self, store: str, seconds: float) -> None:
        note("store_reachable", f"checkpoint store {store} reachable again after {seconds:.1f} s", seconds=seconds)
        self._reporter.store_reachable(store, seconds)


@torch.no_grad()
def evaluate(model: LanguageModel, feed: Feed, batches: int, device: Device = CPU) -> float:
    model.eval()
    with device.autocast():
        losses = [
            model(batch.inputs.to(device.torch), batch.targets.to(device.torch))[1].item()
            for batch in feed.validation(batches)
        ]
    model.train()
    return sum(losses) / len(losses)


def job_feed(cfg: WorkerConfig, reporter: Reporter, seq_len: int, vocab_size: int, *, rank: int, world: int) -> Feed:
    """This worker's data feed; the lead relays first-pass progress, every worker its warnings.

    Every object it reads is checked against the model's ``vocab_size`` and the job's tokenizer.

    A dataset too small for ``eval_batches`` fails the job now (a ``DataError``, permanent) instead
    of at its first evaluation: a built-in or ``file://`` dataset's validation split is read at once;
    an S3 or Azure one is checked from its listing (objects' sizes), so nothing is fetched twice, and
    the first evaluation catches the rest (text that is skipped, say).
    """

    def relay(event: DataEvent) -> None:
        warning = event.kind == "warning"
        note(
            f"data_{event.kind}",
            f"data {event.kind}: {event.message}",
            level=logging.WARNING if warning else logging.INFO,
        )
        if warning or cfg.worker == 0:
            reporter.message(f"data {event.kind}: {event.message}")

    spec = cfg.spec
    feed = open_feed(
        spec.dataset,
        batch_size=spec.batch_size,
        seq_len=seq_len,
        seed=spec.seed,
        rank=rank,
        world=world,
        access=cfg.dataset_access,
        utf8_policy=Utf8Policy(spec.on_bad_utf8 or server_default("on_bad_utf8")),
        on_event=relay,
        vocabulary=Vocabulary(vocab_size, spec.tokenizer),
    )
    try:
        feed.check_validation(spec.eval_batches, fetch=spec.dataset.startswith(LOCAL_DATASETS))
    except BaseException:
        feed.close()
        raise
    return feed


def train_step(
    model: LanguageModel,
    optimizer,
    feed: Feed,
    step: int,
    lr: float,
    *,
    accumulate: int,
    trace: bool,
    device: Device = CPU,
    loss_factor: float = 1.0,
) -> float:
    """One optimizer step over ``accumulate`` micro-batches of the feed; returns their mean loss.

    With ``trace`` (the job asked for its data lineage) a line per micro-batch names its samples.
    ``loss_factor`` (an admin's injected fault, evaluation only) multiplies each micro-batch's loss.
    """
    optimizer.set_lr(lr)
    total = 0.0
    for _ in range(accumulate):
        batch = feed.next_batch()
        if trace:
            print(f"samples step={step} ids={','.join(map(str, batch.sample_ids.tolist()))}", flush=True)
        with device.autocast():
            _, loss = model(batch.inputs.to(device.torch), batch.targets.to(device.torch))
        if loss_factor != 1.0:
            loss = loss * loss_factor
        (loss / accumulate).backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad()
    loss_value = total / accumulate
    if not math.isfinite(loss_value):
        note("warning", f"step {step}: loss is {loss_value}", level=logging.WARNING, step=step)
    return loss_value


class Strategy(Protocol):
    """What a round is and what happens after it; the trainer runs the inner steps."""

    group: dist.ProcessGroup | None  # the ranks that train one model together (the optimizer averages over them)
    rank: int  # this process's rank in ``group``
    commits: bool  # whether this process's group seals the job's checkpoints
    local_steps: int  # H: nominal optimizer steps per round
    budget_s: float | None  # a time budget for a round's inner steps instead of H of them
    processes: int  # every process of the job
    mesh: DeviceMesh | None  # an allreduce job's FSDP2/TP mesh (None: each rank holds the whole model)
    data_rank: int  # this process's part of the data, of ``data_world`` (tensor-parallel peers share theirs)
    data_world: int
    device: Device  # where the model trains

    def prepare(self, model: LanguageModel, state: TrainingState) -> None:
        """Register the strategy's own checkpointed parts (before any restore)."""

    def first_round(self, start: int) -> int:
        """The round this process starts at, resuming from checkpoint step ``start`` (0: none)."""

    def after_round(self, round_: int, steps_done: int) -> None:
        """Runs after every round's inner steps (the decentralized outer step)."""

    def finish(self, evaluate: Callable[[], float]) -> float:
        """After the last round: the final model's validation loss."""

    def close(self) -> None: ...


def join_group(rendezvous: str, rank: int, world: int, backend: str = "gloo") -> dist.ProcessGroup | None:
    """The process group of ``world`` processes (None for one process)."""
    if world == 1:
        return None
    dist.init_process_group(
        backend, init_method=rendezvous, rank=rank, world_size=world, timeout=dt.timedelta(minutes=5)
    )
    return dist.group.WORLD


class AllReduce:
    """Single-process and data-parallel training: rounds of one step.

    Without a mesh the optimizer averages the gradients (like DDP); with one,
    FSDP2 and tensor parallelism (:mod:`cantata.trainer.parallel`) do.
    """

    local_steps = 1
    budget_s: float | None = None
    commits = True

    def __init__(self, cfg: WorkerConfig):
        parallelism = Parallelism.of(cfg.spec)
        # a GPU job's replicated model trains on its GPU over NCCL; a mesh (FSDP2/TP) stays on the CPU for now
        self.device = pick_device(cfg.spec.gpus_per_worker) if parallelism.world == 1 else CPU
        self.group = join_group(cfg.rendezvous, cfg.worker, cfg.workers, self.device.backend)
        self.rank = cfg.worker
        self.processes = cfg.workers
        self.mesh = parallelism.mesh() if parallelism.world > 1 else None
        self.data_rank, self.data_world = data_rank(self.mesh) if self.mesh is not None else (cfg.worker, cfg.workers)

    def prepare(self, model: LanguageModel, state: TrainingState) -> None:
        pass

    def first_round(self, start: int) -> int:
        return start

    def after_round(self, round_: int, steps_done: int) -> None:
        pass

    def finish(self, evaluate: Callable[[], float]) -> float:
        return evaluate()

    def close(self) -> None:
        if self.group is not None:
            dist.destroy_process_group()


def strategy_of(cfg: WorkerConfig, reporter: Reporter) -> Strategy:
    if cfg.spec.algorithm in DECENTRALIZED:
        from cantata.trainer.decentralized import Decentralized  # its gossip stack loads only when used

        return Decentralized(cfg, reporter)
    return AllReduce(cfg)


def crossed(step: int, done: int, every: int) -> bool:
    """Whether the last ``done`` steps, ending at ``step``, passed a multiple of ``every``."""
    return step // every > (step - done) // every


def log_progress(step: int, steps: int, loss: float, lr: float, tokens_per_s: float, grad_norm: float | None) -> None:
    norm = f" grad_norm {grad_norm:.3g}" if grad_norm is not None else ""
    note(
        "step",
        f"step {step}/{steps} loss {loss:.4f} lr {lr:.3g} tokens/s {tokens_per_s:,.0f}{norm}",
        step=step,
        steps=steps,
        loss=loss,
        lr=lr,
        tokens_per_s=tokens_per_s,
        grad_norm=grad_norm,
    )


def mean_over(value: float, group: dist.ProcessGroup | None, device: Device) -> float:
    """``value``'s mean over the ranks of ``group`` (NaN if any rank's is), the same on every rank."""
    if group is None:
        return value
    box = torch.tensor([value], dtype=torch.float64, device=device.torch)
    dist.all_reduce(box, group=group)
    return box.item() / dist.get_world_size(group)


def log_eval(step: int, val_loss: float) -> None:
    note("eval", f"eval at step {step}: validation loss {val_loss:.4f}", step=step, val_loss=val_loss)


def log_checkpoint(step: int, size: int, keep_last: int) -> None:
    note(
        "checkpoint",
        f"checkpoint at step {step} sealed ({size:,} bytes); keeping the last {keep_last}",
        step=step,
        size_bytes=size,
        keep_last=keep_last,
    )


def report_data_wait(reporter: Reporter, feed: Feed, train_seconds: float) -> None:
    if train_seconds > 0:
        reporter.message(
            f"data wait {feed.wait_seconds:.2f} s, {feed.wait_seconds / train_seconds:.2%} of training time"
        )


class DataPosition:
    """The feed's position, with the data-parallel place it was drawn at.

    A job resumed on another mesh reads its data as another rank of another
    data-parallel world: a saved position does not apply (``moved``), and the
    trainer seeks to where that rank's batches stand at the checkpoint's step.
    """

    def __init__(self, feed: Feed, data_rank: int, data_world: int):
        self._feed, self._place = feed, {"data_rank": data_rank, "data_world": data_world}
        self.moved = False

    def state_dict(self) -> dict:
        return {**self._feed.state_dict(), **self._place}

    def load_state_dict(self, state: dict) -> None:
        self.moved = any(state.get(key, value) != value for key, value in self._place.items())
        if not self.moved:
            self._feed.load_state_dict(state)


class Trainer:
    """One worker process's training, from its checkpoint (if any) to ``spec.steps``."""

    feed: Feed  # open while ``run`` runs

    def __init__(self, cfg: WorkerConfig, reporter: Reporter, stop: threading.Event, strategy: Strategy):
        self.cfg, self.spec, self.reporter, self.stop, self.strategy = cfg, cfg.spec, reporter, stop, strategy
        self.lead = cfg.worker == 0  # reports progress for the job
        spec = self.spec
        self.device = strategy.device
        note("device", f"training on {self.device.kind} ({visible_devices()}), collectives over {self.device.backend}")
        self.model: LanguageModel
        self.pipeline: Pipeline | None = None  # a pipeline-parallel job's stages of this rank
        if spec.float8:  # before anything is built: a worker without float8 tensor cores fails at once
            check_float8_device(self.device.torch)
        if strategy.mesh is not None and "pp" in (strategy.mesh.mesh_dim_names or ()):
            self.pipeline = Pipeline.build(spec, strategy.mesh, self.device.torch)
            self.model = self.pipeline.part  # type: ignore[assignment]  # its stages, under the decoder's names
        elif strategy.mesh is None:
            self.model = build_model(spec.model, spec.seed).to(self.device.torch)
            if spec.float8:
                swapped = convert_to_float8(self.model, self.device.torch)
                note("float8", f"{swapped} linear layers train in float8", layers=swapped)
            if spec.compile:
                compile_blocks(self.model)
        else:  # built on the meta device: each rank allocates and initialises only its shards
            precision = MixedPrecision(spec.mixed_precision or server_default("mixed_precision"))
            self.model = build_sharded(
                spec.model, spec.seed, strategy.mesh, precision, spec.activation_checkpointing, spec.compile
            )
        self.seq_len = min(spec.seq_len, self.model.cfg.block_size)
        checkpointing = family_of_module(self.model).checkpointing if self.pipeline is None else None
        if checkpointing is not None:
            checkpointing(self.model, spec.activation_checkpointing)
        self.optimizer = build_optimizer(  # where the optimizer is built: on the sharded model, if any
            self.model,
            spec.optimizer,
            lr=spec.lr,
            weight_decay=spec.weight_decay,
            grad_clip=spec.grad_clip,
            process_group=strategy.group if strategy.mesh is None else None,  # with a mesh FSDP2 reduces gradients
            mesh=strategy.mesh if self.pipeline is None else None,  # muon: Canzona on DTensor over the whole mesh
            tp_dim="tp" if strategy.mesh is not None and self.pipeline is None else None,  # TP-Canzona across "tp"
            clip_group=self.pipeline.group if self.pipeline is not None else None,
            **spec_settings(spec),
        )
        self.schedule = Schedule.of(spec)
        self.checkpoints = JobCheckpoints(
            spec.checkpoint_store,
            cfg.tenant,
            cfg.job_id,
            cfg.checkpoint_keys,
            spec.keep_last,
            outages=ReportedOutages(reporter),
        )
        self.state = TrainingState(
            self.checkpoints, rank=strategy.rank, process=cfg.worker, group=strategy.group, commits=strategy.commits
        )
        self.saver = (
            AsyncSaver(self.state, lambda done: mean_over(float(done), strategy.group, self.device) == 1.0)
            if spec.async_checkpoint
            else None
        )
        self.recovery = Recovery(RecoveryPolicy.of(spec))  # inactive for gasloc and diloco, which refuse its fields
        self.fault = Fault.from_dict(cfg.fault) if cfg.fault else None
        self.faults_fired = 0

    def run(self) -> float:
        """Train to ``spec.steps``; returns the final validation loss. Raises ``Stopped`` on cancel."""
        spec, strategy = self.spec, self.strategy
        vocab_size = self.model.cfg.vocab_size
        feed = job_feed(
            self.cfg, self.reporter, self.seq_len, vocab_size, rank=strategy.data_rank, world=strategy.data_world
        )
        with closing(feed):
            self.feed = feed
            start = self.state.latest_step()
            if not start and spec.init_from:  # before the strategy takes its copy (the outer step's theta)
                self.load_initial_weights()
            if self.pipeline is not None:  # every rank writes its stages' parameters and optimizer state
                self.state.register(SHARDED_PART, Scope.SHARDED, PipelineState(self.pipeline, self.optimizer))
            elif strategy.mesh is None:
                self.state.register("model", Scope.LEAD, self.model)
                self.state.register("optim", Scope.RANK, self.optimizer)
            else:  # every rank writes its own shards; a checkpoint taken on one mesh loads on another
                self.state.register(SHARDED_PART, Scope.SHARDED, MeshState(self.model, self.optimizer))
            position = DataPosition(feed, strategy.data_rank, strategy.data_world)
            self.state.register("data", Scope.PROCESS, position)
            strategy.prepare(self.model, self.state)
            if start:
                self.state.restore(start)
            if start >= spec.steps:  # resumed from the final checkpoint: nothing left to train
                return self.evaluate()
            first_round = strategy.first_round(start)
            local_steps = strategy.local_steps
            at_checkpoint = bool(start) and start == first_round * local_steps
            if at_checkpoint:
                note("resumed", f"resumed from checkpoint at step {start}", step=start)
                if self.lead:
                    self.reporter.message(f"resumed from checkpoint at step {start}")
            if not (at_checkpoint and self.state.restore_beside(start) and not position.moved) and first_round:
                # rejoining later than the checkpoint (or it holds no position): where that round's batches begin
                feed.seek(first_round * local_steps * spec.grad_accum)
            began = time.perf_counter()
            try:
                self.rounds(first_round)
            except Stopped:  # a stop waits for the save in flight: its checkpoint is committed
                self.finish_save()
                raise
            val_loss = strategy.finish(self.evaluate)
            log_eval(spec.steps, val_loss)
            if self.lead:
                self.reporter.eval(spec.steps, val_loss)
            self.save(spec.steps)
            self.finish_save()
            if self.lead:
                report_data_wait(self.reporter, feed, time.perf_counter() - began)
            return val_loss

    def load_initial_weights(self) -> None:
        """The job's ``init_from`` weights: under the roots its datasets may come from, or in a data source's store."""
        access = self.cfg.dataset_access
        objects = open_weights(self.spec.init_from, roots=access.roots, credentials=access.init_credentials)
        files = load_weights(self.model, objects)
        note("init_from", f"initial weights from {objects.uri} ({files} files)", files=files)
        if self.lead:
            self.reporter.message(f"initial weights from {objects.uri} ({files} files)")

    def rounds(self, first: int) -> None:
        """Every round from ``first`` on: inner steps, the strategy's step after them, reports, evaluations, saves."""
        spec, strategy = self.spec, self.strategy
        local_steps = strategy.local_steps
        report_every = max(1, spec.steps // 100)
        tokens_per_step = spec.batch_size * self.seq_len * spec.grad_accum * strategy.data_world
        tick, steps_since, waited = time.perf_counter(), 0, self.feed.wait_seconds
        t = first
        while t < math.ceil(spec.steps / local_steps):
            try:
                done, loss = self.inner_steps(t)
            except LossTripped as tripped:
                t = self.roll_back(tripped) // local_steps
                continue
            strategy.after_round(t, done)
            step = min((t + 1) * local_steps, spec.steps)
            steps_since += done
            if crossed(step, local_steps, report_every) or step == spec.steps:
                now = time.perf_counter()
                tokens_per_s = tokens_per_step * steps_since / (now - tick)
                lr = self.schedule.lr(step) * self.recovery.lr_scale
                optimizer_window = self.optimizer.window_metrics()  # collective: every rank of the group
                log_progress(step, spec.steps, loss, lr, tokens_per_s, self.optimizer.last_grad_norm)
                if self.lead:
                    self.reporter.progress(
                        step,
                        loss,
                        tokens_per_s,
                        lr,
                        tokens=tokens_per_step * steps_since,
                        step_time_s=(now - tick) / max(steps_since, 1),
                        data_wait_s=self.feed.wait_seconds - waited,
                        grad_norm=self.optimizer.last_grad_norm,
                        optimizer=optimizer_window,
                    )
                tick, steps_since, waited = now, 0, self.feed.wait_seconds
            if step == spec.steps:
                return  # the final model is evaluated and saved after the strategy's finish
            if crossed(step, local_steps, spec.eval_every):
                val_loss = self.evaluate()
                log_eval(step, val_loss)
                if self.lead:
                    self.reporter.eval(step, val_loss)
            if crossed(step, local_steps, spec.checkpoint_every):
                self.save(step)
            elif self.saver is not None:
                self.reported(self.saver.poll())
            t += 1

    def roll_back(self, tripped: LossTripped) -> int:
        """Restore the model and the optimizer of the latest checkpoint; returns its step.

        The data feed stays where it is: the batches of the steps since the checkpoint are skipped.
        """
        step, trip = tripped.step, tripped.trip
        self.finish_save()  # the save in flight holds the latest checkpoint
        checkpoint = self.state.latest_step()
        self.recovery.roll_back(step, trip, checkpoint)  # raises past max_rollbacks: alike on every rank
        self.state.restore(checkpoint)
        n, scale = self.recovery.rollbacks, self.recovery.lr_scale
        note(
            "rollback",
            f"rollback {n}: {trip.cause} at step {step} (loss {trip.loss:.4g}); restored the checkpoint of step "
            f"{checkpoint}, skipping the batches of steps {checkpoint + 1}-{step}; lr x {scale:g}",
            level=logging.WARNING,
            step=step,
            checkpoint_step=checkpoint,
            cause=str(trip.cause),
            rollback=n,
        )
        if self.lead:
            self.reporter.rollback(step, checkpoint, trip, n, scale)
        return checkpoint

    def inner_steps(self, t: int) -> tuple[int, float]:
        """Round ``t``'s inner steps: ``local_steps`` of them, or as many as fit in the time budget (at least one).

        The learning rate follows the nominal step ``t * H + h + 1``, held at the
        round's last one for steps past H. Returns the steps done and the last loss.
        """
        spec, strategy = self.spec, self.strategy
        local_steps, budget_s = strategy.local_steps, strategy.budget_s
        began = time.perf_counter()
        done = 0
        while True:
            if self.stop.is_set() or self.reporter.stop_requested:
                raise Stopped()
            step = t * local_steps + min(done, local_steps - 1) + 1
            lr = self.schedule.lr(min(step, spec.steps)) * self.recovery.lr_scale
            factor = self.fault.factor(step, self.cfg.worker, self.faults_fired) if self.fault else 1.0
            self.faults_fired += factor != 1.0
            if self.pipeline is not None:
                self.pipeline.loss_factor = factor
                loss = self.pipeline.train_step(self.optimizer, self.feed, step, lr, trace=spec.trace_samples)
            else:
                loss = train_step(
                    self.model,
                    self.optimizer,
                    self.feed,
                    step,
                    lr,
                    accumulate=spec.grad_accum,
                    trace=spec.trace_samples,
                    device=self.device,
                    loss_factor=factor,
                )
            if self.recovery.policy.active:
                trip = self.recovery.check(step, mean_over(loss, strategy.group, self.device))
                if trip is not None:
                    raise LossTripped(step, trip)
            done += 1
            if budget_s is None:
                more = done < local_steps
            else:  # stop unless one more step at the mean pace so far fits; a group's ranks follow rank 0
                elapsed = time.perf_counter() - began
                more = bool(share_from_rank0(int(elapsed * (done + 1) / done <= budget_s), strategy.group))
            if not more:
                return done, loss

    def evaluate(self) -> float:
        if self.pipeline is not None:
            return self.pipeline.evaluate(self.feed, self.spec.eval_batches)
        return evaluate(self.model, self.feed, self.spec.eval_batches, self.device)

    def save(self, step: int) -> None:
        """Checkpoint ``step``: at once, or with ``async_checkpoint`` staged here and committed once uploaded."""
        if self.saver is not None:
            self.reported(self.saver.start(step))
            return
        saving = time.perf_counter()
        size = self.state.save(step)
        self.reported(Committed(step, size, time.perf_counter() - saving))

    def finish_save(self) -> None:
        """Wait for the asynchronous save in flight, if any, and commit it (its error is raised here)."""
        if self.saver is not None:
            self.reported(self.saver.finish())

    def reported(self, committed: Committed | None) -> None:
        """Tell of a saved checkpoint: the shards' note on every rank, the checkpoint's on the lead."""
        if committed is None:
            return
        step = committed.step
        if self.strategy.mesh is not None:
            seconds, sealed = self.checkpoints.last_sharded
            note(
                "checkpoint_shards",
                f"rank {self.strategy.rank} sealed its shards of step {step}: {sealed:,} bytes in {seconds:.3f} s",
                step=step,
                size_bytes=sealed,
                seconds=seconds,
            )
        if self.lead:
            assert committed.size is not None  # the lead is rank 0 of the committing group
            log_checkpoint(step, committed.size, self.spec.keep_last)
            self.reporter.checkpoint(step, self.spec.checkpoint_store, committed.size, committed.seconds)


def train(cfg: WorkerConfig, reporter: Reporter, stop: threading.Event) -> float:
    """Train the job to ``spec.steps`` as its algorithm says; returns the final validation loss."""
    torch.set_num_threads(cfg.threads)
    strategy = strategy_of(cfg, reporter)
    try:
        return Trainer(cfg, reporter, stop, strategy).run()
    finally:
        strategy.close()
