"""The training settings of a job: the learning-rate schedule, clipping, accumulation, and their checks.

Jobs that run them for real, through the CLI, are in tests/test_cli_jobs.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from cantata.proto.vocabulary import LrSchedule
from cantata.sdk.errors import InvalidJob
from cantata.sdk.job import Job
from cantata.server.jobs.jobspec import InvalidField, parse_job_spec
from cantata.trainer.data.corpus import BatchSampler
from cantata.trainer.loop import Schedule, train_step
from cantata.trainer.model import build_model
from cantata.trainer.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _parsed(**fields):
    return parse_job_spec(Job(name="t", **fields).to_proto(), default_store="file:///tmp/ckpt", roots=[Path("/tmp")])


def test_warmup_then_cosine_decay_to_the_floor():
    s = Schedule(peak=1.0, steps=110, warmup=10, kind=LrSchedule.COSINE, min_ratio=0.1)
    assert [s.lr(step) for step in (1, 5, 10)] == pytest.approx([0.1, 0.5, 1.0])
    assert s.lr(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay
    assert s.lr(110) == pytest.approx(0.1)
    assert all(s.lr(a) >= s.lr(a + 1) for a in range(10, 110))


def test_linear_decay_and_constant_and_no_warmup():
    linear = Schedule(peak=2.0, steps=100, warmup=0, kind=LrSchedule.LINEAR, min_ratio=0.0)
    assert [linear.lr(1), linear.lr(50), linear.lr(100)] == pytest.approx([2.0 * 0.99, 1.0, 0.0])
    constant = Schedule(peak=2.0, steps=100, warmup=4, kind=LrSchedule.CONSTANT, min_ratio=0.0)
    assert [constant.lr(2), constant.lr(4), constant.lr(100)] == pytest.approx([1.0, 2.0, 2.0])


def test_the_server_fills_the_training_defaults_in():
    spec = _parsed(steps=300)
    assert (spec.warmup_steps, spec.lr_schedule, spec.min_lr_ratio, spec.weight_decay) == (15, "cosine", 0.1, 0.1)
    assert (spec.grad_clip, spec.grad_accum, spec.eval_batches, spec.keep_last) == (0.0, 1, 8, 3)
    assert Schedule.of(spec) == Schedule(spec.lr, 300, 15, LrSchedule.COSINE, 0.1)
    explicit = _parsed(steps=300, warmup_steps=0, min_lr_ratio=0.0, weight_decay=0.0)
    assert (explicit.warmup_steps, explicit.min_lr_ratio, explicit.weight_decay) == (0, 0.0, 0.0)  # 0 is a value


@pytest.mark.parametrize(
    ("fields", "field", "why"),
    [
        ({"steps": 10, "warmup_steps": 11}, "warmup_steps", "at most steps (10)"),
        ({"lr_schedule": "step"}, "lr_schedule", "known: cosine, linear, constant"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio", "[0, 1]"),
        ({"grad_clip": -1.0}, "grad_clip", "> 0"),
        ({"grad_accum": 5000}, "grad_accum", "1..1024"),
        ({"keep_last": -2}, "keep_last", "1..10000"),
    ],
)
def test_bad_training_settings_are_refused_naming_the_field(fields, field, why):
    with pytest.raises(InvalidField, match=re.escape(why)) as caught:
        parse_job_spec(Job(name="t", **fields).to_proto(), default_store="file:///tmp/ckpt", roots=[Path("/tmp")])
    assert caught.value.field == field


def test_clipping_bounds_the_global_gradient_norm():
    model = build_model("gpt-tiny", 1)
    optimizer = build_optimizer(model, "adamw", lr=1e-3, grad_clip=0.25)
    for p in model.parameters():
        p.grad = torch.full_like(p, 3.0)
    optimizer.step()
    assert optimizer.last_grad_norm is not None and optimizer.last_grad_norm > 100  # the norm before clipping
    clipped = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
    assert clipped == pytest.approx(0.25, rel=1e-4)


class _Feed:
    """The built-in corpus's batches of one size, as a feed hands them out."""

    def __init__(self, batch_size: int):
        from cantata.trainer.data import load_builtin_corpus

        self._sampler = BatchSampler(load_builtin_corpus().train, batch_size, 32, 7, 0)
        self.drawn = 0

    def next_batch(self):
        self.drawn += 1
        return self._sampler.batch(self.drawn)


def test_accumulating_two_micro_batches_takes_one_step_on_their_mean_gradient():
    """Two micro-batches of 4 with accumulation give the gradient of their 8 sequences at once."""
    feed = _Feed(4)
    halves = [feed.next_batch(), feed.next_batch()]
    whole = build_model("gpt-tiny", 3)
    _, loss = whole(torch.cat([b.inputs for b in halves]), torch.cat([b.targets for b in halves]))
    loss.backward()
    expected = [p.grad.clone() for p in whole.parameters()]

    model = build_model("gpt-tiny", 3)
    optimizer = build_optimizer(model, "adamw", lr=0.0)
    seen: list[list[torch.Tensor]] = []
    original_step = optimizer.step
    optimizer.step = lambda: (seen.append([p.grad.clone() for p in model.parameters()]), original_step())[1]
    replay = _Feed(4)
    mean_loss = train_step(model, optimizer, replay, 1, 0.0, accumulate=2, trace=False)
    assert replay.drawn == 2 and len(seen) == 1  # two micro-batches, one optimizer step
    assert mean_loss == pytest.approx(loss.item(), rel=1e-5)
    for got, want in zip(seen[0], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_job_validates_on_the_client_and_the_server(path):
    job = Job.from_dict(yaml.safe_load(path.read_text()))
    job.validate()
    spec = parse_job_spec(job.to_proto(), default_store="file:///tmp/ckpt", roots=[Path("/tmp")])
    assert spec.algorithm == path.stem  # one example per algorithm, named after it


def test_there_is_an_example_for_each_algorithm():
    from cantata.proto.vocabulary import Algorithm

    assert {p.stem for p in EXAMPLES} == {a.value for a in Algorithm}


def test_an_unknown_key_in_a_job_file_is_named():
    with pytest.raises(InvalidJob, match=re.escape("unknown field(s): learning_rate")) as caught:
        Job.from_dict({"name": "x", "learning_rate": 0.1})
    assert caught.value.field == "learning_rate"


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(InvalidJob, match="warmup -> warmup_steps") as caught:
        Job.from_dict({"name": "x", "warmup": 10, "grad_clipping": 1.0})
    assert "grad_clipping -> grad_clip" in caught.value.message
