"""Jobs end to end: real server over TLS, real worker processes, real training."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest
import torch

from cantata.sdk import errors
from cantata.sdk.client import Client
from cantata.sdk.job import Job
from testkit.platform import readable
from testkit.waiting import JOB_TIMEOUT_S, wait_for

QUICK = dict(model="gpt-tiny", steps=60, eval_every=30, checkpoint_every=30, batch_size=8, seq_len=32)


def _pids_of(job_id: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"cantata.trainer.worker" in cmdline and job_id.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def test_single_worker_job_trains_to_success(tenant):
    handle = tenant.submit(Job(name="single", **QUICK))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    events = list(handle.events())
    states = [e.state for e in events if e.kind == "STATE"]
    assert states == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert events[-1].terminal and events[-1].state == "SUCCEEDED"
    losses = [e.loss for e in events if e.kind == "PROGRESS"]
    assert losses[-1] < losses[0] - 0.5, losses  # it learned something
    evals = [e for e in events if e.kind == "EVAL"]
    assert [e.step for e in evals] == [30, 60] and status.val_loss == pytest.approx(evals[-1].val_loss)
    assert [c.step for c in tenant.checkpoints(handle.id)] == [30, 60]
    assert not _pids_of(handle.id)


def test_two_worker_allreduce_job_and_checkpoint_download(tenant, tmp_path):
    handle = tenant.submit(Job(name="dp", algorithm="allreduce", workers=2, **QUICK))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    assert status.val_loss < 4.5  # from ln(256) = 5.55 at the start
    logs = list(handle.logs())
    assert {w for w, _ in logs} == {0, 1}
    assert any("finished" in line for _, line in logs)
    path = tenant.download_checkpoint(handle.id, 60, tmp_path / "model.pt")
    state = torch.load(path, weights_only=True)
    assert state["tok_emb.weight"].shape == (256, 64)


def test_muon_job_trains_with_canzona_data_parallel(tenant):
    handle = tenant.submit(Job(name="muon", algorithm="allreduce", workers=2, optimizer="muon", **QUICK))
    status = handle.wait()
    assert status.state == "SUCCEEDED", status.reason
    losses = [e.loss for e in handle.events() if e.kind == "PROGRESS"]
    assert losses[-1] < losses[0] - 0.5 and status.val_loss < 4.5


def test_submit_is_idempotent_even_when_racing(tenant):
    job = Job(name="idem", **QUICK)
    results, barrier = [], threading.Barrier(4)

    def submit():
        barrier.wait()
        results.append(tenant.submit(job).id)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert [j.id for j in tenant.list()].count(results[0]) == 1
    tenant.cancel(results[0])


def test_events_resume_from_a_cursor_without_gaps_or_duplicates(tenant):
    handle = tenant.submit(Job(name="cursor", **QUICK))
    first = []
    for event in handle.events():
        first.append(event)
        if len(first) == 3:
            break  # the client drops the stream mid-job
    rest = list(handle.events(cursor=first[-1].seq))
    seqs = [e.seq for e in first + rest]
    assert seqs == list(range(1, len(seqs) + 1))
    assert rest[-1].terminal


def test_cancel_stops_workers_and_ends_cancelled(tenant):
    handle = tenant.submit(
        Job(
            name="long",
            model="gpt-tiny",
            steps=100_000,
            eval_every=50_000,
            checkpoint_every=50_000,
            batch_size=8,
            seq_len=32,
        )
    )
    wait_for(lambda: handle.status().state == "RUNNING", timeout=JOB_TIMEOUT_S)
    assert _pids_of(handle.id)
    assert handle.cancel().state in ("CANCELLING", "CANCELLED")
    status = handle.wait()
    assert status.state == "CANCELLED"
    assert [e.state for e in handle.events() if e.kind == "STATE"][-2:] == ["CANCELLING", "CANCELLED"]
    wait_for(lambda: not _pids_of(handle.id), timeout=JOB_TIMEOUT_S)


def test_cancel_reaches_a_queued_job(tenant, platform):
    blockers = [
        tenant.submit(
            Job(
                name=f"block{i}",
                workers=4,
                algorithm="allreduce",
                steps=100_000,
                eval_every=50_000,
                checkpoint_every=50_000,
                batch_size=4,
                seq_len=16,
            )
        )
        for i in range(2)
    ]
    queued = tenant.submit(Job(name="waiting", **QUICK))
    assert queued.status().state == "QUEUED"
    assert queued.cancel().state == "CANCELLED"
    for b in blockers:
        b.cancel()
    for b in blockers:
        assert b.wait().state == "CANCELLED"


def test_a_crashing_worker_fails_the_job_with_its_reason(tenant, platform):
    handle = tenant.submit(Job(name="crash", max_failures=0, **QUICK))  # no restart: the first crash ends it
    pids = wait_for(lambda: handle.status().state == "RUNNING" and _pids_of(handle.id), timeout=JOB_TIMEOUT_S)
    os.kill(pids[0], 9)
    status = handle.wait()
    assert status.state == "FAILED"
    assert "worker 0 exited with code -9" in status.reason
    wait_for(lambda: not _pids_of(handle.id), timeout=JOB_TIMEOUT_S)


def test_worker_error_is_reported_as_the_failure_reason(tenant, platform):
    tiny = platform.tenant_dir("acme", "tiny-data")
    (tiny / "a.txt").write_text("too short")
    readable(tiny)
    status = tenant.submit(Job(name="bad-data", dataset=tiny.as_uri(), **QUICK)).wait()
    assert status.state == "FAILED"
    assert f"DataError: dataset {tiny.as_uri()}: rank 0's objects hold no training window" in status.reason


@pytest.mark.parametrize(
    "field,overrides",
    [
        ("model", {"model": "gpt-huge"}),
        ("dataset", {"dataset": "ftp://example/data"}),
        ("steps", {"steps": 0}),
        ("workers", {"workers": 0}),
        ("name", {"name": ""}),
        ("lr", {"lr": float("nan")}),
    ],
)
def test_client_side_validation_names_the_field(tenant, field, overrides):
    with pytest.raises(errors.InvalidJob) as err:
        tenant.submit(Job(**{"name": "bad", **overrides}))
    assert err.value.field == field


def _raw_submit(client: Client, **spec):
    """Bypass client-side validation to prove the server checks on its own."""
    from cantata.proto.v1 import common_pb2, jobs_pb2

    request = jobs_pb2.SubmitJobRequest(request_id=uuid.uuid4().hex, spec=common_pb2.JobSpec(**spec))
    return client._call(client._jobs.SubmitJob, request)


@pytest.mark.parametrize(
    "field,spec",
    [
        ("model", {"name": "x", "model": "gpt-huge", "steps": 10}),
        ("dataset", {"name": "x", "dataset": "ftp://host/x", "steps": 10}),
        ("steps", {"name": "x", "steps": -5}),
        ("workers", {"name": "x", "steps": 10, "workers": -1}),
        ("checkpoint_store", {"name": "x", "steps": 10, "checkpoint_store": "file:///etc"}),
        ("checkpoint_store", {"name": "x", "steps": 10, "checkpoint_store": "file:///tmp/../etc"}),
        ("dataset", {"name": "x", "steps": 10, "dataset": "file:///etc/passwd"}),
        ("dataset", {"name": "x", "steps": 10, "dataset": "s3://src@Not_A_Bucket/x"}),
        ("dataset", {"name": "x", "steps": 10, "dataset": "az://src@container/../other"}),
        ("on_bad_utf8", {"name": "x", "steps": 10, "on_bad_utf8": "ignore"}),
        ("ranks_per_worker", {"name": "x", "steps": 10, "workers": 2, "ranks_per_worker": 2}),
        ("ranks_per_worker", {"name": "x", "steps": 10, "workers": 2, "algorithm": "gasloc", "ranks_per_worker": -1}),
        ("ranks_per_worker", {"name": "x", "steps": 10, "workers": 128, "algorithm": "gasloc", "ranks_per_worker": 4}),
    ],
)
def test_server_side_validation_names_the_field(tenant, field, spec):
    with pytest.raises(errors.InvalidJob) as err:
        _raw_submit(tenant, **spec)
    assert err.value.field == field
    assert err.value.request_id


def test_store_through_a_symlink_is_refused(tenant, platform, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    link = platform.data_dir / "checkpoints" / "acme" / "sneaky"  # in the tenant's own store folder
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(outside)
    with pytest.raises(errors.InvalidJob, match="symbolic link") as err:
        tenant.submit(Job(name="x", steps=10, checkpoint_store=(link / "sub").as_uri()))
    assert err.value.field == "checkpoint_store"


def test_oversized_requests_are_refused(tenant):
    with pytest.raises(errors.InvalidJob) as err:
        tenant.submit(Job(name="x" * 5_000_000, steps=10))
    assert err.value.field == "name"
    with pytest.raises(errors.InvalidArgument, match="too large"):
        _raw_submit(tenant, name="x" * 5_000_000, steps=10)
