"""GPUs: the max_gpus quota at submit, and the local executor's share of the node's GPUs and memory (no worker
starts here)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2 as pb
from cantata.server.executors import NotPlaceable
from cantata.server.executors.local import LocalExecutor
from cantata.server.jobs import memory
from cantata.server.store import JobRecord, QuotaExceeded, Store
from cantata.server.workers.sandbox import Identities


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "state.db")
    store.add_tenancy_request("acme", b"csr", "sha256:acme")
    store.approve_tenant("acme", "sha256:acme", b"cert", pb.Quota(max_gpus=4), "root")
    yield store
    store.close()


def _spec(workers: int, gpus: int) -> pb.JobSpec:
    return pb.JobSpec(
        name="g", model="gpt-tiny", workers=workers, ranks_per_worker=1, steps=10, gpus_per_worker=gpus, batch_size=4
    )


def _submit(store: Store, n: int, workers: int, gpus: int) -> JobRecord:
    return store.submit_job(store.tenant("acme"), f"request-{n:04d}", _spec(workers, gpus))[0]


def test_max_gpus_counts_every_unfinished_job_of_the_tenant(store):
    assert store.tenant("acme").quota.max_gpus == 4
    first = _submit(store, 1, workers=2, gpus=1)
    _submit(store, 2, workers=1, gpus=2)  # 4 of 4
    with pytest.raises(QuotaExceeded, match="GPUs") as refused:
        _submit(store, 3, workers=1, gpus=1)
    assert (refused.value.limit, refused.value.used) == (4, 5)
    _submit(store, 4, workers=3, gpus=0)  # CPU jobs do not count
    store.transition(first.id, pb.CANCELLED, "cancelled")
    _submit(store, 5, workers=2, gpus=1)  # the ended job's GPUs are free again


def _executor(tmp_path: Path, gpus: int, memory_bytes: int = 1 << 40) -> LocalExecutor:
    return LocalExecutor(
        tmp_path / "jobs",
        None,  # placement needs no CA, secrets or certificates
        "127.0.0.1:1",
        dt.timedelta(hours=1),
        secrets=None,
        certificates=None,
        grace=1.0,
        identities=Identities(61000, 10, root=False),
        memory_limit=lambda job: 0,
        slots=8,
        memory=memory_bytes,
        gpus=gpus,
    )


def test_the_local_executor_places_gpu_jobs_on_the_gpus_it_has(tmp_path, store):
    executor = _executor(tmp_path, gpus=2)
    executor.placement(_submit(store, 1, workers=2, gpus=1))  # fits
    with pytest.raises(NotPlaceable, match="needs 3 GPUs; this node has 2") as never:
        executor.placement(_Queued(_spec(workers=3, gpus=1)))
    assert never.value.never  # the others pass it, and it waits with its reason
    assert _executor(tmp_path, gpus=0).gpus == 0


@dataclass
class _Queued:
    """What placement reads of a queued job: its spec."""

    spec: pb.JobSpec


def test_the_local_executor_reserves_each_running_jobs_memory_and_frees_it_when_its_workers_are_gone(tmp_path, store):
    spec = pb.JobSpec(name="m", model="gpt-tiny", workers=1, ranks_per_worker=1, steps=10, batch_size=64, seq_len=256)
    need = memory.job_estimate(spec)
    executor = _executor(tmp_path, gpus=0, memory_bytes=2 * need + need // 2)  # room for two such jobs
    running = [store.submit_job(store.tenant("acme"), f"mem-{i}", spec)[0] for i in range(3)]
    executor.adopt(running[0], [])  # a job re-adopted after a restart holds its share as a launched one does
    executor.adopt(running[1], [])
    with pytest.raises(NotPlaceable, match=r"waiting for .* of memory \(.* free beside 2 running job\(s\)\)") as wait:
        executor.placement(running[2])
    assert not wait.value.never  # it waits for room, it is not parked
    executor.release(running[0].id)
    executor.placement(running[2])  # the finished job's share is free again
    too_big = _Queued(
        pb.JobSpec(name="m", model="gpt-tiny", workers=3, ranks_per_worker=1, steps=10, batch_size=64, seq_len=256)
    )
    with pytest.raises(NotPlaceable, match="of memory; this node has") as never:
        executor.placement(too_big)
    assert never.value.never
