"""Sweeps end to end: a real server over TLS, real worker processes, Optuna's pruner stopping real trials."""

from __future__ import annotations

import pytest

from cantata.sdk.job import Job
from cantata.sdk.sweeps import Sweep, progress_line

# Tiny trials, evaluated often: ASHA's first rung (3 steps) comes long before a trial's end (60 steps).
TRIAL = dict(name="tiny", model="gpt-tiny", steps=60, eval_every=3, eval_batches=1, batch_size=4, seq_len=16)
SPACE = {"lr": {"low": 1e-5, "high": 3e-1, "log": True}, "warmup_steps": {"low": 0, "high": 20}}


def _sweep(**overrides) -> Sweep:
    fields = dict(job=Job(**TRIAL), parameters=SPACE, trials=12, concurrency=3, sampler="random", seed=7)
    return Sweep(**{**fields, **overrides})


def test_asha_prunes_a_third_of_twelve_trials_and_reports_the_best(tenant):
    submitted = tenant.sweeps.submit(_sweep(name="asha"))
    import time

    t0 = time.monotonic()
    status = tenant.sweeps.wait(
        submitted.id, on_change=lambda s: print(round(time.monotonic() - t0, 1), progress_line(s))
    )
    assert status.state == "SUCCEEDED", status.reason
    assert len(status.trials) == 12 and len({t.job_id for t in status.trials}) == 12
    pruned = [t for t in status.trials if t.state == "PRUNED"]
    completed = [t for t in status.trials if t.state == "COMPLETE"]
    print(f"pruned {len(pruned)}, completed {len(completed)}: {[t.step for t in pruned]}")
    assert len(pruned) >= 4, status.trials
    assert len(pruned) + len(completed) == 12
    assert status.best is not None and status.best.value == min(t.value for t in completed)
    for trial in pruned:  # stopped early: its job was cancelled as pruned before its last step
        job = tenant.get(trial.job_id)
        assert (job.state, job.reason) == ("CANCELLED", "pruned") and job.step < TRIAL["steps"], job
        assert trial.step < TRIAL["steps"]
    best = tenant.get(status.best.job_id)
    assert best.state == "SUCCEEDED" and best.val_loss == pytest.approx(status.best.value)
    assert f"sweep={status.id}" in best.tags
    assert {j.id for j in tenant.list(tag=f"sweep={status.id}")} == {t.job_id for t in status.trials}
