"""The training loop of one worker: single-process or data-parallel all-reduce.

Every worker builds the same model from the job's seed, reads its own
batches from the job's data feed, and lets the optimizer synchronise gradients
across the process group. The feed's position is part of every checkpoint, so
a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from contextlib import closing
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cantata.proto.vocabulary import LrSchedule
from cantata.trainer.checkpoint import JobCheckpoints
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data import DataEvent, Feed, Utf8Policy, open_feed
from cantata.trainer.model import GPT, build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.reporter import Reporter


class Stopped(Exception):
    """The job was cancelled or the server asked the worker to stop."""


@dataclass(frozen=True)
class Schedule:
    """Linear warm-up from 0 to ``peak``, then cosine or linear decay (or none) to ``min_ratio`` x ``peak``."""

    peak: float
    steps: int
    warmup: int
    kind: LrSchedule = LrSchedule.COSINE
    min_ratio: float = 0.1

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
LOCAL_DATASETS = ("builtin:", "file://")  # datasets whose validation split is read when the job starts


def note(event: str, message: str, *, level: int = logging.INFO, **fields: object) -> None:
    """A line of the worker's log (what ``cantata jobs logs`` shows); ``fields`` are the JSON form's keys."""
    log.log(level, message, extra={"fields": {"event": event, **fields}})


@torch.no_grad()
def evaluate(model: GPT, feed: Feed, batches: int) -> float:
    model.eval()
    losses = [model(batch.inputs, batch.targets)[1].item() for batch in feed.validation(batches)]
    model.train()
    return sum(losses) / len(losses)


def job_feed(cfg: WorkerConfig, reporter: Reporter, seq_len: int, *, rank: int, world: int) -> Feed:
    """This worker's data feed; the lead relays first-pass progress, every worker its warnings.

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
        utf8_policy=Utf8Policy(spec.on_bad_utf8 or "skip"),
        on_event=relay,
    )
    try:
        feed.check_validation(spec.eval_batches, fetch=spec.dataset.startswith(LOCAL_DATASETS))
    except BaseException:
        feed.close()
        raise
    return feed


def train_step(model: GPT, optimizer, feed: Feed, step: int, lr: float, *, accumulate: int, trace: bool) -> float:
    """One optimizer step over ``accumulate`` micro-batches of the feed; returns their mean loss.

    With ``trace`` (the job asked for its data lineage) a line per micro-batch names its samples.
    """
    optimizer.set_lr(lr)
    total = 0.0
    for _ in range(accumulate):
        batch = feed.next_batch()
        if trace:
            print(f"samples step={step} ids={','.join(map(str, batch.sample_ids.tolist()))}", flush=True)
        _, loss = model(batch.inputs, batch.targets)
        (loss / accumulate).backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad()
    loss_value = total / accumulate
    if not math.isfinite(loss_value):
        note("warning", f"step {step}: loss is {loss_value}", level=logging.WARNING, step=step)
    return loss_value


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


def train(cfg: WorkerConfig, reporter: Reporter, stop: threading.Event) -> float:
    """Train to ``spec.steps``; returns the final validation loss. Raises ``Stopped`` on cancel."""
    spec = cfg.spec
    torch.set_num_threads(cfg.threads)
    group = None
    if cfg.workers > 1:
        dist.init_process_group(
            "gloo", init_method=cfg.rendezvous, rank=cfg.worker, world_size=cfg.workers, timeout=dt.timedelta(minutes=5)
        )
        group = dist.group.WORLD
    lead = cfg.worker == 0
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
    with closing(job_feed(cfg, reporter, seq_len, rank=cfg.worker, world=cfg.workers)) as feed:
        schedule = Schedule.of(spec)

        checkpoints = JobCheckpoints(spec.checkpoint_store, cfg.tenant, cfg.job_id, cfg.checkpoint_keys, spec.keep_last)
        start = checkpoints.latest_step() or 0
        if start:
            shards = checkpoints.load(start)
            model.load_state_dict(shards["model"])
            optimizer.load_state_dict(shards[f"optim-{cfg.worker}"])
            feed.load_state_dict(shards[f"data-{cfg.worker}"])
            note("resumed", f"resumed from checkpoint at step {start}", step=start)
            if lead:
                reporter.message(f"resumed from checkpoint at step {start}")

        report_every = max(1, spec.steps // 100)
        tokens_per_step = spec.batch_size * seq_len * spec.grad_accum * cfg.workers
        tick = began = time.perf_counter()
        val_loss = float("nan")
        for step in range(start + 1, spec.steps + 1):
            if stop.is_set() or reporter.stop_requested:
                raise Stopped()
            lr = schedule.lr(step)
            loss = train_step(model, optimizer, feed, step, lr, accumulate=spec.grad_accum, trace=spec.trace_samples)

            if step % report_every == 0 or step == spec.steps:
                now = time.perf_counter()
                done = step - max(start, step - report_every)
                tokens_per_s = tokens_per_step * done / (now - tick)
                log_progress(step, spec.steps, loss, lr, tokens_per_s, optimizer.last_grad_norm)
                if lead:
                    reporter.progress(step, loss, tokens_per_s, lr)
                tick = now
            if step % spec.eval_every == 0 or step == spec.steps:
                val_loss = evaluate(model, feed, spec.eval_batches)
                log_eval(step, val_loss)
                if lead:
                    reporter.eval(step, val_loss)
            if step % spec.checkpoint_every == 0 or step == spec.steps:
                shards = {f"optim-{cfg.worker}": optimizer.state_dict(), f"data-{cfg.worker}": feed.state_dict()}
                if lead:
                    shards["model"] = model.state_dict()
                size = checkpoints.save(step, cfg.worker, shards, group)
                if lead:
                    assert size is not None  # the lead is rank 0, which commits
                    log_checkpoint(step, size, spec.keep_last)
                    reporter.checkpoint(step, spec.checkpoint_store, size)
        if lead:
            report_data_wait(reporter, feed, time.perf_counter() - began)
        if math.isnan(val_loss):  # resumed from the final checkpoint: nothing left to train
            val_loss = evaluate(model, feed, spec.eval_batches)
    if group is not None:
        dist.destroy_process_group()
    return val_loss
