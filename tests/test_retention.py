"""Per-tenant retention: the sweeper deletes ended jobs older than their tenant's retention, and only those.

Real parts in one process: the store on its SQLite file, the audit log, a local checkpoint store; the
sweep is given the time it runs at, so days pass without waiting for them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2
from cantata.security.audit import AuditLog, init_audit, read_records
from cantata.security.sealed_checkpoint import checkpoints_prefix
from cantata.server.database import Database
from cantata.server.jobs.deletion import RETENTION_ACTOR, JobDeletion, RetentionSweeper
from cantata.server.store import JobRecord, NotEnded, NotFound, Store
from cantata.storage import open_store


@pytest.fixture
def parts(tmp_path: Path):
    store = Store(Database(tmp_path / "state.db"))
    init_audit(tmp_path / "audit")
    audit = AuditLog.open(tmp_path / "audit")
    workspaces = tmp_path / "jobs"
    deletion = JobDeletion(store, audit, lambda job_id: workspaces / job_id)
    yield store, audit, deletion, tmp_path
    audit.close()
    store.close()


def _tenant(store: Store, name: str, retention_days: int) -> None:
    store.add_tenancy_request(name, b"csr", f"sha256:{name}")
    store.approve_tenant(name, f"sha256:{name}", b"cert", common_pb2.Quota(), "root")
    store.set_retention(name, retention_days)


def _job(store: Store, tenant: str, name: str, checkpoints: Path, *, end: bool) -> JobRecord:
    spec = common_pb2.JobSpec(name=name, steps=10, checkpoint_store=checkpoints.as_uri())
    job, _ = store.submit_job(store.tenant(tenant), f"request-{name}", spec, "")
    blobs = open_store(spec.checkpoint_store)
    for step in (5, 10):  # what a job's checkpoints leave in its store
        blobs.put(f"{checkpoints_prefix(tenant, job.id)}{step:012d}/model.sealed", b"sealed")
    for state in (common_pb2.STARTING, common_pb2.RUNNING) + ((common_pb2.SUCCEEDED,) if end else ()):
        assert store.transition(job.id, state)
    return store.job(job.id)


def test_the_sweep_deletes_only_ended_jobs_past_their_tenants_retention(parts):
    store, _audit, deletion, root = parts
    _tenant(store, "acme", 7)
    _tenant(store, "forever", 0)
    checkpoints = root / "checkpoints"
    old = _job(store, "acme", "old", checkpoints, end=True)
    running = _job(store, "acme", "running", checkpoints, end=False)
    kept = _job(store, "forever", "kept", checkpoints, end=True)
    (root / "jobs" / old.id).mkdir(parents=True)
    (root / "jobs" / old.id / "worker-0.log").write_text("step 1\n")
    sweeper = RetentionSweeper(store, deletion, interval=3600)
    now = dt.datetime.now(dt.UTC)

    assert sweeper.sweep(now + dt.timedelta(days=6)) == []  # not old enough yet
    assert sweeper.sweep(now + dt.timedelta(days=8)) == [old.id]

    with pytest.raises(NotFound):
        store.job(old.id)
    assert not (root / "jobs" / old.id).exists()
    blobs = open_store(checkpoints.as_uri())
    assert blobs.list(checkpoints_prefix("acme", old.id)) == []
    for survivor in (running, kept):  # a job still running, and a tenant that keeps its jobs
        assert store.job(survivor.id).id == survivor.id
        assert len(blobs.list(checkpoints_prefix(survivor.tenant, survivor.id))) == 2
    (record,) = [r for r in read_records(root / "audit") if r.action == "job_deleted"]
    assert (record.actor, record.resource, record.tenant) == (RETENTION_ACTOR, old.id, "acme")
    assert record.details == {"reason": "retention", "name": "old", "checkpoint_objects": 2}  # no call: no request id
    assert sweeper.sweep(now + dt.timedelta(days=30)) == []  # the survivors survive any age
    with pytest.raises(NotEnded):
        deletion.delete(running, actor="spiffe://cantata/tenant/acme", reason="requested")
    assert len(blobs.list(checkpoints_prefix("acme", running.id))) == 2  # a refused deletion removes nothing
