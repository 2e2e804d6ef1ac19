"""Asynchronous checkpoints in real stores (a local directory, moto S3 behind the fault proxy).

A gate in front of the store holds one object's upload until the test releases
it, so the test knows, by an event and not a guessed time, that training went on
while the save was still uploading, and what the store held meanwhile.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cantata.security.keys import JobKey, JobKeys
from cantata.security.sealed_checkpoint import MANIFEST, checkpoints_prefix
from cantata.storage import BlobStore, StoreUnavailableError, open_store
from cantata.storage.base import BlobReader, BlobUpload
from cantata.storage.s3 import S3Store
from cantata.trainer.async_checkpoint import AsyncSaver
from cantata.trainer.checkpoint import JobCheckpoints, Scope, TrainingState
from cantata.trainer.process_exit import exit_without_finalizing
from tests.faultproxy import FaultProxy
from tests.services import S3_TEST_CREDENTIALS

TENANT = "acme"


class GatedStore(BlobStore):
    """``inner``, but the upload of the object named ``held`` waits for :attr:`release` (``reached`` once it waits).

    Once released, the held upload fails if :attr:`cut` is set (for processes the fault proxy cannot stand between).
    """

    def __init__(self, inner: BlobStore, held: str):
        self.inner, self.held = inner, held
        self.reached, self.release = threading.Event(), threading.Event()
        self.cut = False

    @property
    def uri(self) -> str:
        return self.inner.uri

    def _start_upload(self, key: str) -> BlobUpload:
        if key.endswith(f"/{self.held}.sealed"):
            self.reached.set()
            assert self.release.wait(timeout=30), "the test never released the held upload"
            if self.cut:
                raise StoreUnavailableError(f"{key}: the connection was cut")
        return self.inner._start_upload(key)

    def get(self, key: str) -> BlobReader:
        return self.inner.get(key)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        return self.inner.sizes(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


class Position:
    """The data position: a ``PROCESS`` part."""

    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]


class Training:
    """A small model, its optimizer and data position, registered as the trainer registers them."""

    def __init__(self, store: BlobStore, job_id: str, keys: JobKeys, rank: int = 0, group=None):
        self.job = (store, job_id, keys)
        torch.manual_seed(rank)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.05)
        self.position = Position()
        self.checkpoints = JobCheckpoints(store, TENANT, job_id, keys, keep_last=3)
        self.state = TrainingState(self.checkpoints, rank=rank, process=rank, group=group, commits=True)
        self.state.register("model", Scope.LEAD, self.model)
        self.state.register("optim", Scope.RANK, self.optimizer)
        self.state.register("data", Scope.PROCESS, self.position)

    def step(self) -> None:
        batch = torch.linspace(-1, 1, 64).reshape(4, 16) * (self.position.batches + 1)
        self.model(batch).square().mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.position.batches += 1

    def restored(self, step: int) -> Training:
        """A fresh training of the same job, restored from its checkpoint ``step``."""
        other = Training(*self.job)
        other.state.restore(step)
        assert other.state.restore_beside(step)
        return other


def keys_of(job_id: str) -> JobKeys:
    return JobKeys(TENANT, job_id, {1: JobKey(TENANT, job_id, 1, os.urandom(32))})


def manifests(store: BlobStore, job_id: str) -> list[str]:
    return [key for key in store.list(checkpoints_prefix(TENANT, job_id)) if key.endswith(f"/{MANIFEST}.sealed")]


def same_state(a: Training, b: Training) -> None:
    ours_model, theirs_model = a.model.state_dict(), b.model.state_dict()
    assert ours_model.keys() == theirs_model.keys()
    assert all(torch.equal(tensor, theirs_model[name]) for name, tensor in ours_model.items())
    ours, theirs = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys() and ours
    for index, values in ours.items():
        assert all(torch.equal(values[name], theirs[index][name]) for name in values)
    assert a.position.batches == b.position.batches


@pytest.fixture
def s3(moto_service) -> Iterator[tuple[BlobStore, FaultProxy]]:
    """An S3 bucket seen through the fault proxy (no retries: a cut connection fails the call)."""
    bucket = f"async-{uuid.uuid4().hex[:12]}"
    direct = open_store(f"s3://{bucket}/ckpt", endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS)
    assert isinstance(direct, S3Store)
    direct.client.create_bucket(Bucket=bucket)
    proxy = FaultProxy(int(moto_service.endpoint.rsplit(":", 1)[1]))
    yield open_store(f"s3://{bucket}/ckpt", endpoint_url=proxy.endpoint, retries=0, **S3_TEST_CREDENTIALS), proxy
    proxy.close()


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_training_goes_on_while_the_save_uploads_and_the_manifest_comes_last(kind, tmp_path, request) -> None:
    inner = open_store(f"file://{tmp_path}") if kind == "local" else request.getfixturevalue("s3")[0]
    store, job_id = GatedStore(inner, held="model"), f"job-{kind}"
    training = Training(store, job_id, keys_of(job_id))
    saver = AsyncSaver(training.state, all_done=lambda done: done)
    for _ in range(3):
        training.step()
    saved = {name: value.clone() for name, value in training.model.state_dict().items()}
    assert saver.start(3) is None  # nothing was in flight
    assert store.reached.wait(timeout=30)  # the upload thread holds the first object, the model
    for _ in range(2):
        training.step()  # training goes on meanwhile, changing the tensors the save copied
    assert saver.poll() is None and saver.in_flight == 3
    assert manifests(inner, job_id) == [] and training.checkpoints.latest_step() is None
    store.release.set()
    committed = saver.finish()
    assert committed is not None and committed.step == 3 and committed.size
    assert len(manifests(inner, job_id)) == 1 and training.checkpoints.latest_step() == 3
    restored = training.restored(3)
    assert all(torch.equal(restored.model.state_dict()[name], value) for name, value in saved.items())
    assert restored.position.batches == 3


def test_an_upload_cut_midway_leaves_no_checkpoint_and_fails_the_save(s3) -> None:
    inner, proxy = s3
    store, job_id = GatedStore(inner, held="optim-0"), "job-cut"
    training = Training(store, job_id, keys_of(job_id))
    saver = AsyncSaver(training.state, all_done=lambda done: done)
    training.step()
    saver.start(1)
    store.release.set()
    assert saver.finish() is not None  # a first checkpoint, committed
    store.release.clear()
    store.reached.clear()
    training.step()
    saver.start(2)
    assert store.reached.wait(timeout=30)  # the model's object is stored, the optimizer's not yet
    proxy.set("reset")
    store.release.set()
    with pytest.raises(StoreUnavailableError):  # what a synchronous save raises when the store cuts it off
        saver.finish()
    proxy.set("pass")
    assert saver.in_flight is None and saver.finish() is None  # failed closed: nothing left to commit
    assert training.checkpoints.latest_step() == 1 and len(manifests(inner, job_id)) == 1


def test_resuming_from_an_async_save_equals_resuming_from_a_sync_one(tmp_path) -> None:
    local = open_store(f"file://{tmp_path}")
    sync, asynchronous = (
        Training(local, "job-sync", keys_of("job-sync")),
        Training(local, "job-async", keys_of("job-async")),
    )
    saver = AsyncSaver(asynchronous.state, all_done=lambda done: done)
    for step in range(1, 5):
        sync.step()
        asynchronous.step()
        if step % 2 == 0:
            sync.state.save(step)
            saver.start(step)  # commits the previous save first: at most one in flight
    saver.finish()
    same_state(sync, asynchronous)
    assert sync.checkpoints.latest_step() == asynchronous.checkpoints.latest_step() == 4
    same_state(sync.restored(4), asynchronous.restored(4))
    same_state(sync.restored(2), asynchronous.restored(2))


class Sharded:
    """A ``SHARDED`` part over one process: the model's parameters, saved and loaded through DCP."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])

    def load_unsharded(self, listed: dict) -> None:
        raise AssertionError("the checkpoint is sharded")


def test_a_sharded_part_is_staged_through_dcp_and_uploaded_later(tmp_path) -> None:
    store, job_id = GatedStore(open_store(f"file://{tmp_path}"), held="train.0"), "job-sharded"
    keys = keys_of(job_id)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    state = TrainingState(
        JobCheckpoints(store, TENANT, job_id, keys, keep_last=3), rank=0, process=0, group=None, commits=True
    )
    state.register("train", Scope.SHARDED, Sharded(model))
    saver = AsyncSaver(state, all_done=lambda done: done)
    saved = {name: value.clone() for name, value in model.state_dict().items()}
    saver.start(1)
    assert store.reached.wait(timeout=30)
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on before the object is stored
    assert manifests(store, job_id) == []
    store.release.set()
    saver.finish()
    torch.manual_seed(1)
    restored = torch.nn.Linear(16, 8)
    fresh = TrainingState(
        JobCheckpoints(store, TENANT, job_id, keys, keep_last=3), rank=0, process=0, group=None, commits=True
    )
    fresh.register("train", Scope.SHARDED, Sharded(restored))
    fresh.restore(fresh.latest_step())
    assert all(torch.equal(restored.state_dict()[name], value) for name, value in saved.items())


def _rank(rank: int, world: int, port: int, root: str, keys: str, out: str) -> None:
    """Two asynchronous saves: the first committed once both ranks uploaded, the second cut on rank 1."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)

    def all_done(done: bool) -> bool:
        flag = torch.tensor([int(done)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    store = GatedStore(open_store(f"file://{root}"), held=f"optim-{rank}")
    store.release.set()
    training = Training(store, "job-ranks", JobKeys.from_json(keys), rank=rank, group=dist.group.WORLD)
    saver = AsyncSaver(training.state, all_done)
    training.step()
    saver.start(1)
    rounds = 0
    while saver.in_flight is not None:  # every rank polls alike, and commits in the same round
        training.step()
        saver.poll()
        rounds += 1
    store.cut = rank == 1
    training.step()
    saver.start(2)
    try:
        saver.finish()
        error = None
    except Exception as failed:
        error = type(failed).__name__
    result = {"error": error, "latest": training.checkpoints.latest_step(), "rounds": rounds}
    Path(out, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    exit_without_finalizing()  # gloo's threads may still hold work: see cantata.trainer.process_exit


@pytest.mark.integration  # two gloo processes
def test_an_upload_failing_on_one_rank_fails_the_save_on_every_rank_and_commits_nothing(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    keys = keys_of("job-ranks").to_json()
    mp.start_processes(
        _rank, args=(2, port, str(tmp_path / "store"), keys, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert [result["error"] for result in results] == ["CheckpointUploadError", "StoreUnavailableError"]
    assert [result["latest"] for result in results] == [1, 1]
    assert results[0]["rounds"] == results[1]["rounds"] >= 1
    assert len(manifests(open_store(f"file://{tmp_path / 'store'}"), "job-ranks")) == 1
