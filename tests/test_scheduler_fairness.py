"""Fair start order across tenants on a real server whose node runs one worker at a time (one slot).

Tenant alpha queues two jobs before bravo and charlie queue one each; alpha's first holds the slot meanwhile (a long
job, cancelled once the others are queued). Every tenant's first job must start before any tenant's second: the
freed slot goes to the tenants that have not started a job yet, though alpha's second was queued before theirs.
The order is read from the audit log's ``job_started`` records (one per start, in start order).
"""

from __future__ import annotations

import pytest

from cantata.sdk.job import Job
from cantata.security.audit import Action, read_records
from testkit.platform import Platform

TINY = dict(model="gpt-tiny", steps=2, batch_size=4, seq_len=16)


@pytest.fixture
def platform(tmp_path):
    p = Platform(tmp_path, settings={"max_workers_on_node": 1})
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


def test_when_slots_are_scarce_every_tenant_starts_its_first_job_before_any_tenant_starts_a_second(platform):
    alpha, bravo, charlie = (platform.enroll(name) for name in ("alpha", "bravo", "charlie"))
    try:
        holder = alpha.submit(Job(name="holder", **{**TINY, "steps": 100_000}))  # takes the one slot
        alpha_second = alpha.submit(Job(name="second", **TINY))  # queued before bravo's and charlie's
        bravo_first = bravo.submit(Job(name="first", **TINY))
        charlie_first = charlie.submit(Job(name="first", **TINY))
        started = next(e for e in holder.events() if e.state in ("STARTING", "RUNNING") or e.terminal)
        assert started.state in ("STARTING", "RUNNING")  # it holds the slot: the others wait, queued
        alpha.cancel(holder.id)
        assert alpha.job(holder.id).wait().state == "CANCELLED"
        for client, job in ((alpha, alpha_second), (bravo, bravo_first), (charlie, charlie_first)):
            assert client.job(job.id).wait().state == "SUCCEEDED"
    finally:
        for client in (alpha, bravo, charlie):
            client.close()
    order = [r.resource for r in read_records(platform.data_dir / "audit") if r.action == Action.JOB_STARTED]
    assert order == [holder.id, bravo_first.id, charlie_first.id, alpha_second.id]
