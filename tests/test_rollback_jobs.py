"""Recovery policies end to end: an admin injects a loss fault into queued jobs, real workers roll back.

One blocker job holds the node (two worker slots) while every faulted job is
submitted and its fault planned (faults are only for queued jobs); then the
blocker goes and the faulted jobs run, each test waiting for its own.
"""

from __future__ import annotations

import math
import re

import pytest

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records
from testkit.platform import Platform

SMALL = dict(model="gpt-tiny", steps=20, eval_every=20, checkpoint_every=5, batch_size=4, seq_len=16)
SPIKE = dict(spike_zscore=10.0, spike_window=8)  # a natural z-score of 10 over 8 losses is not to be expected
BLOCKER = dict(model="gpt-tiny", steps=10_000, eval_every=10_000, checkpoint_every=10_000, batch_size=2, seq_len=8)
QUOTA = {"max_concurrent_jobs": 8, "max_workers_per_job": 8, "max_total_steps": 100_000}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("platform"), settings={"max_workers_on_node": 2, "default_quota": QUOTA})
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


@pytest.fixture(scope="module")
def jobs(platform, tenant):
    """The faulted jobs by name, submitted and planned behind a blocker, then let run."""
    blocker = tenant.submit(Job(name="blocker", algorithm="allreduce", workers=2, **BLOCKER))
    planned = {
        "spike": (Job(name="spike", trace_samples=True, **SPIKE, **SMALL), dict(fault="loss_spike", step=12)),
        "nan": (Job(name="nan", on_nonfinite="rollback", **SMALL), dict(fault="nonfinite", step=7)),
        "exhausted": (
            Job(name="exhausted", on_nonfinite="rollback", max_rollbacks=1, **SMALL),
            dict(fault="nonfinite", step=7, times=2),
        ),
        "allreduce": (
            Job(name="allreduce", algorithm="allreduce", workers=2, rollback_lr_scale=0.5, **SPIKE, **SMALL),
            dict(fault="loss_spike", step=12, workers=[1]),
        ),
    }
    handles = {}
    with platform.admin() as admin:
        for name, (job, fault) in planned.items():
            handles[name] = tenant.submit(job)
            admin.inject_fault(handles[name].id, **fault)
    blocker.cancel()
    return handles


def rollbacks(handle) -> list:
    return [e for e in handle.events() if e.kind == "ROLLBACK"]


def audited(platform, job_id: str, action: Action) -> list:
    return [r for r in read_records(platform.data_dir / "audit") if r.resource == job_id and r.action == action]


def test_a_loss_spike_rolls_back_once_skips_its_window_and_the_job_finishes(platform, tenant, jobs):
    handle = jobs["spike"]
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    [event] = rollbacks(handle)
    assert event.step == 10 and event.loss > 100
    assert "loss_spike at step 12" in event.message and "skipped the batches of steps 11-12" in event.message
    [record] = audited(platform, handle.id, Action.JOB_ROLLED_BACK)
    assert record.details["cause"] == "loss_spike" and record.details["checkpoint_step"] == 10
    assert record.details["skipped_steps"] == [11, 12] and record.details["zscore"] > 10
    assert audited(platform, handle.id, Action.FAULT_INJECTION_PLANNED)
    # the data lineage: steps 11 and 12 ran twice, and the first pass's samples were never trained on again
    samples = [
        (int(m[1]), m[2].split(","))
        for _, line in handle.logs()
        if (m := re.match(r"samples step=(\d+) ids=(\S+)", line))
    ]
    assert [step for step, _ in samples] == [*range(1, 13), *range(11, 21)]
    skipped = {i for _, ids in samples[10:12] for i in ids}
    assert skipped and not skipped & {i for _, ids in samples[12:] for i in ids}
    assert math.isfinite(status.val_loss)


def test_a_non_finite_loss_rolls_back_to_a_finite_model(tenant, jobs):
    handle = jobs["nan"]
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    [event] = rollbacks(handle)
    assert event.step == 5 and "nonfinite at step 7" in event.message
    assert math.isfinite(status.val_loss) and status.val_loss < 10  # the NaN weights were restored away


def test_one_rollback_more_than_max_rollbacks_fails_the_job_with_its_reason(tenant, jobs):
    handle = jobs["exhausted"]
    status = handle.wait()
    assert status.state == "FAILED"
    assert "nonfinite at step 7" in status.reason and "max_rollbacks" in status.reason
    assert len(rollbacks(handle)) == 1


def test_every_rank_of_an_allreduce_job_rolls_back_when_one_ranks_loss_spikes(platform, tenant, jobs):
    handle = jobs["allreduce"]
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    [event] = rollbacks(handle)
    assert event.step == 10 and "lr x 0.5" in event.message
    rolled = {worker for worker, line in handle.logs() if "rollback 1: loss_spike at step 12" in line}
    assert rolled == {0, 1}
    lr = {r.step: r.value for r in handle.metrics(["lr"])}
    assert lr[20] == pytest.approx(0.5 * 3e-3 * 0.1)  # half the schedule's last rate (min_lr_ratio x lr)


def test_only_an_admin_injects_a_fault_into_a_queued_job(platform, tenant, jobs):
    with pytest.raises(errors.PermissionDenied):
        tenant.inject_fault(jobs["spike"].id, "loss_spike", 3)
    with platform.admin() as admin:
        with pytest.raises(errors.InvalidArgument, match="unknown fault 'bitflip'"):
            admin.inject_fault(jobs["spike"].id, "bitflip", 3)
        jobs["spike"].wait()
        with pytest.raises(errors.CantataError, match="queued"):
            admin.inject_fault(jobs["spike"].id, "loss_spike", 3)


@pytest.mark.parametrize(
    ("fields", "field", "match"),
    [
        (dict(spike_zscore=0.0), "spike_zscore", "must be a number in"),
        (dict(spike_window=1, spike_zscore=3.0), "spike_window", r"2\.\.10000"),
        (dict(spike_window=20), "spike_window", "only with spike_zscore"),
        (dict(on_nonfinite="retry"), "on_nonfinite", "unknown on_nonfinite 'retry'"),
        (dict(rollback_lr_scale=1.5), "rollback_lr_scale", "must be a number in"),
        (dict(algorithm="gasloc", workers=2, on_nonfinite="rollback"), "on_nonfinite", "only for single or allreduce"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_field(tenant, fields, field, match):
    with pytest.raises(errors.InvalidJob, match=match) as refused:
        tenant.submit(Job(name="bad-policy", **{**SMALL, **fields}))
    assert refused.value.field == field
