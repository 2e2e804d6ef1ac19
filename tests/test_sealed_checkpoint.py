"""Sealed checkpoints on every store: round trips, retention, rotation and the attack matrix.

Every attack must be refused with its specific error before ``torch.load``
runs for any shard (the shards are ordered so that a reader that
deserialised as it went would already have loaded ``model``).
"""

from __future__ import annotations

import io
import json
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from cantata.security.keys import JobKeys, KeyUnwrapError, LocalKeyring, MasterKey, UnknownKeyVersionError
from cantata.security.sealed_checkpoint import (
    MANIFEST,
    CheckpointNotFoundError,
    InvalidCheckpointError,
    ManifestError,
    MissingShardError,
    ShardMismatchError,
    _parse_manifest,
    begin_checkpoint,
    commit_checkpoint,
    key_versions_in_use,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    object_key,
    read_unlisted_shard,
    rewrap_checkpoints,
    save_checkpoint,
    write_shard,
)
from cantata.security.stream_aead import (
    TAG_SIZE,
    ContextMismatchError,
    FormatDowngradeError,
    HeaderAuthenticationError,
    SegmentAuthenticationError,
    StreamHeader,
    TruncatedStreamError,
)
from cantata.storage import BlobStore, BlobUpload, StoreUnavailableError, open_store
from cantata.storage.s3 import S3Store
from tests.services import S3_TEST_CREDENTIALS, start_moto, stop_service

SEGMENT = 4096
TARGET = "optimizer.rank0"

torch.set_num_threads(1)


def training_state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 64, generator=generator), "b": torch.zeros(64)},
        TARGET: {
            "state": {0: {"momentum": torch.randn(64, 64, generator=generator), "step": torch.tensor(seed)}},
            "param_groups": [{"lr": 0.02, "params": [0]}],
        },
        "rng": {"torch": torch.Generator().manual_seed(seed).get_state()},
        "dataloader": f'{{"epoch": 1, "offset": {seed}}}'.encode(),
    }


def assert_state_equal(loaded: dict, expected: dict) -> None:
    assert loaded.keys() == expected.keys()
    assert torch.equal(loaded["model"]["w"], expected["model"]["w"])
    assert torch.equal(loaded[TARGET]["state"][0]["momentum"], expected[TARGET]["state"][0]["momentum"])
    assert loaded[TARGET]["param_groups"] == expected[TARGET]["param_groups"]
    assert torch.equal(loaded["rng"]["torch"], expected["rng"]["torch"])
    assert loaded["dataloader"] == expected["dataloader"]


@pytest.fixture
def keyring(tmp_path: Path) -> LocalKeyring:
    ring = LocalKeyring(tmp_path / "keyring.sealed", MasterKey.create_file(tmp_path / "master.key"))
    ring.ensure_tenant("acme")
    ring.ensure_tenant("globex")
    return ring


@pytest.fixture
def keys(keyring: LocalKeyring) -> JobKeys:
    return keyring.job_keys("acme", "job-1")


@pytest.fixture
def torch_loads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, for every archive torch deserialises, whether its unpickler is the weights-only one.

    Both ``torch.load`` and the sealed loader's zero-copy path go through ``torch.serialization._load``.
    """
    calls: list[bool] = []
    real_load = torch.serialization._load

    def recording_load(zip_file, map_location, pickle_module, *args, **kwargs):
        calls.append(pickle_module is torch._weights_only_unpickler)
        return real_load(zip_file, map_location, pickle_module, *args, **kwargs)

    monkeypatch.setattr(torch.serialization, "_load", recording_load)
    return calls


def save(store: BlobStore, keys: JobKeys, step: int, **options) -> dict:
    state = training_state(step)
    save_checkpoint(
        store,
        tenant=keys.tenant,
        job_id=keys.job_id,
        step=step,
        shards=state,
        kek=keys.current,
        segment_size=SEGMENT,
        **options,
    )
    return state


def load(store: BlobStore, keys: JobKeys, step: int) -> dict:
    return load_checkpoint(store, tenant=keys.tenant, job_id=keys.job_id, step=step, keys=keys)


def rewrite(store: BlobStore, key: str, change: Callable[[bytes], bytes]) -> None:
    store.put(key, change(store.get_bytes(key)))


def body_start(sealed: bytes) -> int:
    source = io.BytesIO(sealed)
    StreamHeader.read(source)
    return source.tell()


def flip_bit(data: bytes, position: int) -> bytes:
    changed = bytearray(data)
    changed[position] ^= 0x10
    return bytes(changed)


def test_round_trip_list_and_latest(blob_store: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    first, second = save(blob_store, keys, 100), save(blob_store, keys, 200)
    assert_state_equal(load(blob_store, keys, 100), first)
    assert_state_equal(load(blob_store, keys, 200), second)
    assert torch_loads and all(torch_loads)
    listed = list_checkpoints(blob_store, tenant="acme", job_id="job-1", keys=keys)
    assert [info.step for info in listed] == [100, 200]
    assert sorted(shard.name for shard in listed[1].shards) == ["dataloader", "model", TARGET, "rng"]
    assert latest_checkpoint(blob_store, tenant="acme", job_id="job-1", keys=keys).step == 200


def test_nothing_in_the_store_is_plaintext(blob_store: BlobStore, keys: JobKeys) -> None:
    state = save(blob_store, keys, 100)
    weights = state["model"]["w"].numpy().tobytes()
    for key in blob_store.list():
        stored = blob_store.get_bytes(key)
        assert weights[:64] not in stored
        assert state["dataloader"] not in stored
        assert b"param_groups" not in stored


def test_retention_keeps_the_last_k(blob_store: BlobStore, keys: JobKeys) -> None:
    for step in (100, 200, 300, 400):
        save(blob_store, keys, step, keep_last=2)
    assert [i.step for i in list_checkpoints(blob_store, tenant="acme", job_id="job-1", keys=keys)] == [300, 400]
    assert not any("/000000000100/" in key or "/000000000200/" in key for key in blob_store.list())


def test_invalid_names_are_refused(local_store: BlobStore, keys: JobKeys) -> None:
    cases = [("../x", 1, {"m": b"1"}), ("acme", 1, {MANIFEST: b"1"}), ("acme", 1, {"a/b": b"1"}), ("acme", 1, {}),
             ("acme", -1, {"m": b"1"}), ("acme", 10**12, {"m": b"1"})]  # fmt: skip
    for tenant, step, shards in cases:
        with pytest.raises(InvalidCheckpointError):
            save_checkpoint(local_store, tenant=tenant, job_id="job-1", step=step, shards=shards, kek=keys.current)
    assert local_store.list() == []


def test_ranks_write_their_own_shards_and_one_commits(local_store: BlobStore, keys: JobKeys) -> None:
    state = training_state(100)
    begin_checkpoint(local_store, tenant="acme", job_id="job-1", step=100)
    written = [
        write_shard(local_store, tenant="acme", job_id="job-1", step=100, name=name, state=shard, kek=keys.current)
        for name, shard in state.items()
    ]
    assert latest_checkpoint(local_store, tenant="acme", job_id="job-1", keys=keys) is None
    with pytest.raises(InvalidCheckpointError):
        commit_checkpoint(
            local_store, tenant="acme", job_id="job-1", step=100, shards=written + written[:1], kek=keys.current
        )
    commit_checkpoint(local_store, tenant="acme", job_id="job-1", step=100, shards=written, kek=keys.current)
    assert_state_equal(load(local_store, keys, 100), state)


def test_a_shard_beside_a_checkpoint_reads_back_only_in_its_place(local_store: BlobStore, keys: JobKeys) -> None:
    where: dict[str, Any] = {"tenant": "acme", "job_id": "job-1"}
    write_shard(local_store, **where, step=100, name="data-3", state=b'{"object": 7}', kek=keys.current)
    assert read_unlisted_shard(local_store, **where, step=100, name="data-3", keys=keys) == b'{"object": 7}'
    assert read_unlisted_shard(local_store, **where, step=100, name="data-2", keys=keys) is None
    assert b"object" not in local_store.get_bytes(object_key("acme", "job-1", 100, "data-3"))
    local_store.put(
        object_key("acme", "job-1", 200, "data-3"), local_store.get_bytes(object_key("acme", "job-1", 100, "data-3"))
    )
    with pytest.raises(ContextMismatchError):  # copied to another step
        read_unlisted_shard(local_store, **where, step=200, name="data-3", keys=keys)


def test_missing_checkpoint(blob_store: BlobStore, keys: JobKeys) -> None:
    with pytest.raises(CheckpointNotFoundError):
        load(blob_store, keys, 100)
    assert latest_checkpoint(blob_store, tenant="acme", job_id="job-1", keys=keys) is None


def test_pickled_objects_are_not_deserialised(blob_store: BlobStore, keys: JobKeys) -> None:
    save_checkpoint(
        blob_store, tenant="acme", job_id="job-1", step=1, shards={"model": {"hook": Path("/etc")}}, kek=keys.current
    )
    with pytest.raises(pickle.UnpicklingError):
        load(blob_store, keys, 1)


def test_rotation_rewraps_without_touching_bodies(blob_store: BlobStore, keyring: LocalKeyring, keys: JobKeys) -> None:
    state = save(blob_store, keys, 100)
    bodies = {key: blob_store.get_bytes(key) for key in blob_store.list()}
    keyring.rotate("acme")
    rotated = keyring.job_keys("acme", "job-1")
    assert rewrap_checkpoints(blob_store, tenant="acme", job_id="job-1", keys=rotated) == 5
    assert key_versions_in_use(blob_store, tenant="acme", job_id="job-1") == {2}
    for key, before in bodies.items():
        after = blob_store.get_bytes(key)
        assert after[body_start(after) :] == before[body_start(before) :]
        assert after[: body_start(after)] != before[: body_start(before)]
    assert keyring.retire_unused("acme", key_versions_in_use(blob_store, tenant="acme", job_id="job-1")) == [1]
    assert_state_equal(load(blob_store, keyring.job_keys("acme", "job-1"), 100), state)
    with pytest.raises(UnknownKeyVersionError):
        load(blob_store, keys, 100)


# --- the attack matrix -------------------------------------------------------------------


@pytest.fixture
def saved(blob_store: BlobStore, keys: JobKeys) -> BlobStore:
    """A store holding acme/job-1 checkpoints at steps 100 and 200."""
    save(blob_store, keys, 100)
    save(blob_store, keys, 200)
    return blob_store


def refused(store: BlobStore, keys: JobKeys, step: int, error: type[Exception], torch_loads: list[bool]) -> None:
    with pytest.raises(error):
        load(store, keys, step)
    assert torch_loads == [], "a tensor was deserialised before the attack was detected"


def test_truncated_object(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    rewrite(saved, object_key("acme", "job-1", 200, TARGET), lambda data: data[: body_start(data) + SEGMENT + 100])
    refused(saved, keys, 200, TruncatedStreamError, torch_loads)


def test_truncated_at_a_segment_boundary(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    rewrite(
        saved,
        object_key("acme", "job-1", 200, TARGET),
        lambda data: data[: body_start(data) + 2 * (SEGMENT + TAG_SIZE)],
    )
    refused(saved, keys, 200, TruncatedStreamError, torch_loads)


def test_segments_reordered(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    def swap_first_two(data: bytes) -> bytes:
        start, size = body_start(data), SEGMENT + TAG_SIZE
        first, second = data[start : start + size], data[start + size : start + 2 * size]
        return data[:start] + second + first + data[start + 2 * size :]

    rewrite(saved, object_key("acme", "job-1", 200, TARGET), swap_first_two)
    refused(saved, keys, 200, SegmentAuthenticationError, torch_loads)


@pytest.mark.parametrize("offset", [100, SEGMENT + 5], ids=["body", "tag"])
def test_one_bit_flipped_in_a_segment(saved: BlobStore, keys: JobKeys, torch_loads: list[bool], offset: int) -> None:
    rewrite(saved, object_key("acme", "job-1", 200, TARGET), lambda data: flip_bit(data, body_start(data) + offset))
    refused(saved, keys, 200, SegmentAuthenticationError, torch_loads)


def test_one_bit_flipped_in_the_header(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    def flip_salt(data: bytes) -> bytes:
        return flip_bit(data, data.index(StreamHeader.read(io.BytesIO(data)).salt) + 3)

    rewrite(saved, object_key("acme", "job-1", 200, TARGET), flip_salt)
    refused(saved, keys, 200, HeaderAuthenticationError, torch_loads)


def test_shard_from_step_100_swapped_into_step_200(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    saved.put(object_key("acme", "job-1", 200, TARGET), saved.get_bytes(object_key("acme", "job-1", 100, TARGET)))
    refused(saved, keys, 200, ContextMismatchError, torch_loads)


def test_shard_of_tenant_a_copied_into_tenant_b(
    saved: BlobStore, keyring: LocalKeyring, torch_loads: list[bool]
) -> None:
    victim = keyring.job_keys("globex", "job-1")
    save(saved, victim, 200)
    saved.put(object_key("globex", "job-1", 200, TARGET), saved.get_bytes(object_key("acme", "job-1", 200, TARGET)))
    refused(saved, victim, 200, ContextMismatchError, torch_loads)


def test_manifest_replaced_by_another_checkpoints(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    saved.put(object_key("acme", "job-1", 200, MANIFEST), saved.get_bytes(object_key("acme", "job-1", 100, MANIFEST)))
    refused(saved, keys, 200, ContextMismatchError, torch_loads)


def test_manifest_from_an_earlier_save_of_the_same_step(
    saved: BlobStore, keys: JobKeys, torch_loads: list[bool]
) -> None:
    stale_manifest = saved.get_bytes(object_key("acme", "job-1", 200, MANIFEST))
    save(saved, keys, 200)
    saved.put(object_key("acme", "job-1", 200, MANIFEST), stale_manifest)
    refused(saved, keys, 200, ShardMismatchError, torch_loads)


def test_shard_longer_than_its_manifest_records(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    manifest = saved.get_bytes(object_key("acme", "job-1", 200, MANIFEST))
    write_shard(saved, tenant="acme", job_id="job-1", step=200, name=TARGET, state=bytes(1 << 16), kek=keys.current)
    saved.put(object_key("acme", "job-1", 200, MANIFEST), manifest)
    refused(saved, keys, 200, ShardMismatchError, torch_loads)


def test_stale_worker_keys_after_rotation(
    saved: BlobStore, keyring: LocalKeyring, keys: JobKeys, torch_loads: list[bool]
) -> None:
    keyring.rotate("acme")
    rewrap_checkpoints(saved, tenant="acme", job_id="job-1", keys=keyring.job_keys("acme", "job-1"))
    refused(saved, keys, 200, UnknownKeyVersionError, torch_loads)


def test_envelope_relabelled_with_another_kek_version(
    saved: BlobStore, keyring: LocalKeyring, keys: JobKeys, torch_loads: list[bool]
) -> None:
    keyring.rotate("acme")
    both = keyring.job_keys("acme", "job-1")

    def relabel(data: bytes) -> bytes:
        envelope = StreamHeader.read(io.BytesIO(data)).key_envelope
        return data.replace(envelope, b"\x00\x00\x00\x02" + envelope[4:], 1)

    rewrite(saved, object_key("acme", "job-1", 200, TARGET), relabel)
    refused(saved, both, 200, KeyUnwrapError, torch_loads)


def test_another_jobs_keys(saved: BlobStore, keyring: LocalKeyring, torch_loads: list[bool]) -> None:
    other = keyring.job_keys("acme", "job-2")
    with pytest.raises(KeyUnwrapError):
        load_checkpoint(saved, tenant="acme", job_id="job-1", step=200, keys=other)
    assert torch_loads == []


@pytest.mark.parametrize("name", [TARGET, MANIFEST])
def test_downgraded_format_version(saved: BlobStore, keys: JobKeys, torch_loads: list[bool], name: str) -> None:
    rewrite(saved, object_key("acme", "job-1", 200, name), lambda data: data[:4] + b"\x00" + data[5:])
    refused(saved, keys, 200, FormatDowngradeError, torch_loads)


def test_missing_shard(saved: BlobStore, keys: JobKeys, torch_loads: list[bool]) -> None:
    saved.delete(object_key("acme", "job-1", 200, TARGET))
    refused(saved, keys, 200, MissingShardError, torch_loads)


def test_invalid_manifest_is_skipped_when_resuming(
    saved: BlobStore, keys: JobKeys, caplog: pytest.LogCaptureFixture
) -> None:
    rewrite(saved, object_key("acme", "job-1", 200, MANIFEST), lambda data: flip_bit(data, len(data) - 3))
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(saved, tenant="acme", job_id="job-1", keys=keys).step == 100
    assert "step 200" in caplog.text


# --- failures while saving -----------------------------------------------------------------


class UploadFailure(ConnectionError):
    """The link to the store broke mid-upload."""


class FailingStore(BlobStore):
    """Delegates to ``inner``, but uploads break once ``budget`` bytes have gone through."""

    def __init__(self, inner: BlobStore, budget: int, on_exhausted: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.budget = budget
        self.on_exhausted = on_exhausted

    @property
    def uri(self) -> str:
        return self.inner.uri

    def _start_upload(self, key: str) -> BlobUpload:
        return _BudgetedUpload(self.inner._start_upload(key), self)

    def get(self, key: str):
        return self.inner.get(key)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        return self.inner.sizes(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


class _BudgetedUpload(BlobUpload):
    def __init__(self, inner: BlobUpload, store: FailingStore) -> None:
        self.inner = inner
        self.store = store

    def write(self, data) -> int:
        self.store.budget -= len(data)
        if self.store.budget < 0:
            if self.store.on_exhausted is None:
                raise UploadFailure("connection reset mid-upload")
            self.store.on_exhausted()
        return self.inner.write(data)

    def commit(self) -> None:
        self.inner.commit()

    def abort(self) -> None:
        self.inner.abort()


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint(
    saved: BlobStore, keys: JobKeys, torch_loads: list[bool]
) -> None:
    with pytest.raises(UploadFailure):
        save(FailingStore(saved, budget=30_000), keys, 300)
    assert [i.step for i in list_checkpoints(saved, tenant="acme", job_id="job-1", keys=keys)] == [100, 200]
    assert latest_checkpoint(saved, tenant="acme", job_id="job-1", keys=keys).step == 200
    with pytest.raises(CheckpointNotFoundError):
        load(saved, keys, 300)
    assert_state_equal(load(saved, keys, 200), training_state(200))
    save(saved, keys, 400, keep_last=1)
    assert not any("/000000000300/" in key for key in saved.list()), "retention left the failed save's debris"


def test_a_failed_resave_of_a_step_does_not_leave_its_old_manifest(saved: BlobStore, keys: JobKeys) -> None:
    with pytest.raises(UploadFailure):
        save(FailingStore(saved, budget=30_000), keys, 200)
    assert latest_checkpoint(saved, tenant="acme", job_id="job-1", keys=keys).step == 100


def test_s3_going_down_mid_upload(tmp_path: Path, keys: JobKeys, boto3_session) -> None:
    service = start_moto(tmp_path)
    try:
        store = open_store(
            "s3://ckpt-bucket/p", endpoint_url=service.endpoint, session=boto3_session, retries=1, **S3_TEST_CREDENTIALS
        )
        assert isinstance(store, S3Store)
        store.client.create_bucket(Bucket="ckpt-bucket")
        save(store, keys, 100)
        with pytest.raises(StoreUnavailableError):
            save(FailingStore(store, budget=30_000, on_exhausted=lambda: stop_service(service)), keys, 200)
    finally:
        stop_service(service)


@pytest.mark.parametrize(
    ("field", "value"),
    [("step", 1.0), ("step", True), ("tenant", ["acme"]), ("plaintext_size", "10"), ("sealed_size", 10.0)],
)
def test_a_manifest_field_of_the_wrong_json_type_is_refused(field, value):
    """A manifest equal in value but not in type (``1.0`` for ``1``) is not the manifest that was written."""
    shard = {"name": "model", "kind": "bytes", "plaintext_size": 10, "sealed_size": 99, "sealed_digest": "ab"}
    document = {"format": 1, "tenant": "acme", "job_id": "job-1", "step": 1, "created_at": "t", "shards": [shard]}
    if field in shard:
        shard[field] = value
    else:
        document[field] = value
    with pytest.raises(ManifestError):
        _parse_manifest(json.dumps(document).encode(), "acme", "job-1", 1)
    shard.update(plaintext_size=10, sealed_size=99)
    document.update(step=1, tenant="acme")
    assert _parse_manifest(json.dumps(document).encode(), "acme", "job-1", 1).step == 1
