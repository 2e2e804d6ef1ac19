"""The training loop of one worker: single-process or data-parallel all-reduce.

Every worker builds the same model from the job's seed, reads its own
batches from the job's data feed, and lets the optimizer synchronise gradients
across the process group. The feed's position is part of every checkpoint, so
a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from contextlib import closing
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cantata.trainer.checkpoint import JobCheckpoints
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data import DataEvent, Feed, Utf8Policy, open_feed
from cantata.trainer.model import GPT, build_model
from cantata.trainer.optim import build_optimizer
from cantata.trainer.reporter import Reporter

EVAL_BATCHES = 8
WARMUP_FRACTION = 0.05
WEIGHT_DECAY = 0.1


class Stopped(Exception):
    """The job was cancelled or the server asked the worker to stop."""


@dataclass
class Schedule:
    """Linear warm-up, then cosine decay to 10% of the peak learning rate."""

    peak: float
    steps: int

    def lr(self, step: int) -> float:
        warmup = max(1, int(self.steps * WARMUP_FRACTION))
        if step <= warmup:
            return self.peak * step / warmup
        progress = (step - warmup) / max(1, self.steps - warmup)
        return self.peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: GPT, feed: Feed) -> float:
    model.eval()
    losses = [model(batch.inputs, batch.targets)[1].item() for batch in feed.validation(EVAL_BATCHES)]
    model.train()
    return sum(losses) / len(losses)


def job_feed(cfg: WorkerConfig, reporter: Reporter, seq_len: int, *, rank: int, world: int) -> Feed:
    """This worker's data feed; the lead relays first-pass progress, every worker its warnings."""

    def relay(event: DataEvent) -> None:
        if event.kind == "warning" or cfg.worker == 0:
            reporter.message(f"data {event.kind}: {event.message}")

    spec = cfg.spec
    return open_feed(
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


def train_step(model: GPT, optimizer, feed: Feed, step: int, lr: float, *, trace: bool) -> torch.Tensor:
    """One inner step on the feed's next batch; returns its loss.

    With ``trace`` (the job asked for its data lineage) a log line names the step's samples.
    """
    optimizer.set_lr(lr)
    batch = feed.next_batch()
    if trace:
        print(f"samples step={step} ids={','.join(map(str, batch.sample_ids.tolist()))}", flush=True)
    _, loss = model(batch.inputs, batch.targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


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
    optimizer = build_optimizer(model, spec.optimizer, lr=spec.lr, weight_decay=WEIGHT_DECAY, process_group=group)
    with closing(job_feed(cfg, reporter, seq_len, rank=cfg.worker, world=cfg.workers)) as feed:
        schedule = Schedule(spec.lr, spec.steps)

        checkpoints = JobCheckpoints(spec.checkpoint_store, cfg.tenant, cfg.job_id, cfg.checkpoint_keys)
        start = checkpoints.latest_step() or 0
        if start:
            shards = checkpoints.load(start)
            model.load_state_dict(shards["model"])
            optimizer.load_state_dict(shards[f"optim-{cfg.worker}"])
            feed.load_state_dict(shards[f"data-{cfg.worker}"])
            if lead:
                reporter.message(f"resumed from checkpoint at step {start}")

        report_every = max(1, spec.steps // 100)
        tokens_per_step = spec.batch_size * seq_len * cfg.workers
        tick = began = time.perf_counter()
        val_loss = float("nan")
        for step in range(start + 1, spec.steps + 1):
            if stop.is_set() or reporter.stop_requested:
                raise Stopped()
            loss = train_step(model, optimizer, feed, step, schedule.lr(step), trace=spec.trace_samples)

            if lead and (step % report_every == 0 or step == spec.steps):
                now = time.perf_counter()
                done = step - max(start, step - report_every)
                reporter.progress(step, loss.item(), tokens_per_step * done / (now - tick), schedule.lr(step))
                tick = now
            if step % spec.eval_every == 0 or step == spec.steps:
                val_loss = evaluate(model, feed)
                if lead:
                    reporter.eval(step, val_loss)
            if step % spec.checkpoint_every == 0 or step == spec.steps:
                shards = {f"optim-{cfg.worker}": optimizer.state_dict(), f"data-{cfg.worker}": feed.state_dict()}
                if lead:
                    shards["model"] = model.state_dict()
                size = checkpoints.save(step, cfg.worker, shards, group)
                if lead:
                    assert size is not None  # the lead is rank 0, which commits
                    reporter.checkpoint(step, spec.checkpoint_store, size)
        if lead:
            report_data_wait(reporter, feed, time.perf_counter() - began)
        if math.isnan(val_loss):  # resumed from the final checkpoint: nothing left to train
            val_loss = evaluate(model, feed)
    if group is not None:
        dist.destroy_process_group()
    return val_loss
