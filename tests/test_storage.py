"""The blob stores against a local directory, a real moto S3 server and a real Azurite."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from cantata.storage import (
    BlobNotFoundError,
    BlobStore,
    InvalidBlobKeyError,
    StoreConfigError,
    StoreUnavailableError,
    open_store,
)
from cantata.storage.azure import AzureBlobStore
from cantata.storage.local import LocalStore
from cantata.storage.s3 import MIN_PART_SIZE, S3Store
from tests.services import S3_TEST_CREDENTIALS, RunningService, azurite_connection_string, free_port


class SourceFailure(Exception):
    """Raised by a source that dies midway."""


def dying_source(good_bytes: int) -> Iterator[bytes]:
    yield os.urandom(good_bytes)
    raise SourceFailure("the source died mid-upload")


def test_put_and_get_stream(blob_store: BlobStore) -> None:
    data = os.urandom(3 << 20)
    assert blob_store.put("a/b/file.bin", io.BytesIO(data)) == len(data)
    with blob_store.get("a/b/file.bin") as reader:
        assert reader.read(10) == data[:10]
        assert reader.read(1 << 20) == data[10 : (1 << 20) + 10]
        assert reader.read() == data[(1 << 20) + 10 :]
        assert reader.read(5) == b""


def test_a_range_of_an_object_is_read_alone_and_ends_at_the_object(blob_store: BlobStore) -> None:
    data = os.urandom(1 << 16)
    blob_store.put("ranged", data)
    assert blob_store.get_range("ranged", 1000, 4096) == data[1000:5096]
    assert blob_store.get_range("ranged", len(data) - 10, 100) == data[-10:]
    assert blob_store.get_range("ranged", len(data) + 5, 100) == b""
    assert blob_store.get_range("ranged", 0, 0) == b""
    # the streaming default, for a store that reads no ranges itself, agrees
    assert BlobStore.get_range(blob_store, "ranged", 1000, 4096) == data[1000:5096]
    assert BlobStore.get_range(blob_store, "ranged", len(data) + 5, 100) == b""
    with pytest.raises(BlobNotFoundError):
        blob_store.get_range("absent", 0, 10)


def test_put_from_an_iterator_and_an_empty_object(blob_store: BlobStore) -> None:
    blob_store.put("chunks", iter([b"ab", b"", b"cd"]))
    blob_store.put("empty", b"")
    assert blob_store.get_bytes("chunks") == b"abcd"
    assert blob_store.get_bytes("empty") == b""


def test_list_by_prefix_and_delete(blob_store: BlobStore) -> None:
    for key in ["t/j/2", "t/j/1", "t/k/1", "tx/1", "u"]:
        blob_store.put(key, key.encode())
    assert blob_store.list("t/") == ["t/j/1", "t/j/2", "t/k/1"]
    assert blob_store.list("t/j") == ["t/j/1", "t/j/2"]
    assert blob_store.list("t") == ["t/j/1", "t/j/2", "t/k/1", "tx/1"]
    assert blob_store.list() == ["t/j/1", "t/j/2", "t/k/1", "tx/1", "u"]
    blob_store.delete("t/j/1")
    blob_store.delete("t/j/1")
    assert blob_store.list("t/j/") == ["t/j/2"]


def test_sizes_come_with_the_listing(blob_store: BlobStore) -> None:
    blob_store.put("s/empty", b"")
    blob_store.put("s/three", b"abc")
    blob_store.put("s/big", bytes(70_000))
    blob_store.put("other", b"x")
    assert blob_store.sizes("s/") == {"s/empty": 0, "s/three": 3, "s/big": 70_000}


def test_missing_object(blob_store: BlobStore) -> None:
    with pytest.raises(BlobNotFoundError):
        blob_store.get("nothing/here")


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "../up", "a/../b", ".hidden", "a/.partial/x", "a\\b"])
def test_unsafe_keys_are_refused(blob_store: BlobStore, key: str) -> None:
    with pytest.raises(InvalidBlobKeyError):
        blob_store.put(key, b"x")


def test_a_failed_upload_leaves_the_previous_object(blob_store: BlobStore) -> None:
    blob_store.put("obj", b"previous")
    with pytest.raises(SourceFailure):
        blob_store.put("obj", dying_source(1 << 20))
    with pytest.raises(SourceFailure):
        blob_store.put("new", dying_source(1 << 20))
    assert blob_store.get_bytes("obj") == b"previous"
    assert blob_store.list() == ["obj"]


def test_local_uploads_are_invisible_until_committed(local_store: LocalStore) -> None:
    with local_store.writer("obj") as upload:
        upload.write(b"half")
        assert local_store.list() == []
        assert not (local_store.root / "obj").exists()
    assert local_store.get_bytes("obj") == b"half"
    assert list((local_store.root / ".partial").iterdir()) == []


def test_local_store_refuses_symlinks_out_of_the_root(local_store: LocalStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (local_store.root / "link").symlink_to(outside)
    with pytest.raises(InvalidBlobKeyError):
        local_store.put("link/escaped", b"x")
    assert list(outside.iterdir()) == []


def _listing_as(uid: int, store: LocalStore, prefix: str) -> str:
    """``store.list(prefix)`` in a forked child that dropped to ``uid``: the listing, or the error's type."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, so no interpreter path the uid must reach
        os.close(read)
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            answer = repr(store.list(prefix))
        except BaseException as error:
            answer = type(error).__name__
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer


@pytest.mark.skipif(os.geteuid() != 0, reason="reads the store as another uid")
def test_a_local_listing_fails_on_a_folder_it_cannot_read() -> None:
    # As a worker uid sees a store: a hidden folder must not read as "no checkpoints here" (a job would start over).
    with tempfile.TemporaryDirectory(dir="/tmp") as root:  # a place every uid passes, as stores are
        os.chmod(root, 0o755)
        local_store = LocalStore(root)
        local_store.put("acme/job/step-1/MANIFEST", b"m")
        (local_store.root / "acme").chmod(0o755)
        _check_listing_as_another_uid(local_store)


def _check_listing_as_another_uid(local_store: LocalStore) -> None:
    assert _listing_as(65534, local_store, "acme/") == "['acme/job/step-1/MANIFEST']"
    (local_store.root / "acme" / "job").chmod(0o700)  # root's, not the listing uid's
    assert _listing_as(65534, local_store, "acme/") == "PermissionError"
    assert _listing_as(65534, local_store, "acme/absent/") == "[]"  # a folder that is not there is empty
    assert local_store.list("acme/") == ["acme/job/step-1/MANIFEST"]  # the store's own user still lists it


@pytest.fixture
def small_part_s3_store(s3_store: S3Store, moto_service: RunningService, boto3_session) -> S3Store:
    store = open_store(
        s3_store.uri,
        endpoint_url=moto_service.endpoint,
        session=boto3_session,
        part_size=MIN_PART_SIZE,
        retries=1,
        **S3_TEST_CREDENTIALS,
    )
    assert isinstance(store, S3Store)
    return store


def test_s3_large_objects_use_multipart(small_part_s3_store: S3Store) -> None:
    data = os.urandom(2 * MIN_PART_SIZE + 123)
    small_part_s3_store.put("big", io.BytesIO(data))
    head = small_part_s3_store.client.head_object(
        Bucket=small_part_s3_store.bucket, Key=small_part_s3_store.object_name("big")
    )
    assert head["ETag"].strip('"').endswith("-3")
    assert small_part_s3_store.get_bytes("big") == data


def test_s3_failed_multipart_upload_is_aborted(small_part_s3_store: S3Store) -> None:
    with pytest.raises(SourceFailure):
        small_part_s3_store.put("big", dying_source(MIN_PART_SIZE + 1))
    uploads = small_part_s3_store.client.list_multipart_uploads(Bucket=small_part_s3_store.bucket)
    assert uploads.get("Uploads", []) == []
    assert small_part_s3_store.list() == []


class _EmptyBody:
    def stream(self, **_: object) -> Iterator[bytes]:
        yield b""


def _fail_upload_parts(store: S3Store, times: int) -> list[int]:
    """Answer the next ``times`` UploadPart requests with HTTP 500; return a call counter."""
    calls = [0]

    def answer(request, **_: object) -> AWSResponse | None:
        calls[0] += 1
        return AWSResponse(request.url, 500, {}, _EmptyBody()) if calls[0] <= times else None

    store.client.meta.events.register("before-send.s3.UploadPart", answer)
    return calls


def test_s3_retries_a_5xx_part(small_part_s3_store: S3Store) -> None:
    calls = _fail_upload_parts(small_part_s3_store, times=1)
    data = os.urandom(MIN_PART_SIZE + 10)
    small_part_s3_store.put("big", io.BytesIO(data))
    assert calls[0] == 3
    assert small_part_s3_store.get_bytes("big") == data


def test_s3_persistent_5xx_is_a_clear_error_and_aborts(small_part_s3_store: S3Store) -> None:
    _fail_upload_parts(small_part_s3_store, times=100)
    with pytest.raises(StoreUnavailableError):
        small_part_s3_store.put("big", io.BytesIO(os.urandom(MIN_PART_SIZE + 10)))
    uploads = small_part_s3_store.client.list_multipart_uploads(Bucket=small_part_s3_store.bucket)
    assert uploads.get("Uploads", []) == []


def test_azure_uploads_stage_blocks_and_commit_once(
    azurite_service: RunningService, azure_store: AzureBlobStore
) -> None:
    store = open_store(
        azure_store.uri,
        connection_string=azurite_connection_string(azurite_service.endpoint),
        block_size=1 << 20,
    )
    data = os.urandom((3 << 20) + 5)
    with store.writer("big") as upload:
        upload.write(data)
        assert store.list() == []
    assert isinstance(store, AzureBlobStore)
    committed, _ = store.container.get_blob_client(store.blob_name("big")).get_block_list("committed")
    assert len(committed) == 4
    assert store.get_bytes("big") == data


def test_unreachable_stores_raise_store_unavailable() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    s3 = open_store("s3://bucket/p", endpoint_url=endpoint, retries=0, **S3_TEST_CREDENTIALS)
    azure = open_store("az://container/p", connection_string=azurite_connection_string(endpoint + "/acct"), retries=0)
    for store in (s3, azure):
        with pytest.raises(StoreUnavailableError):
            store.put("key", b"data")
        with pytest.raises(StoreUnavailableError):
            store.list()


def test_open_store_parses_uris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = open_store((tmp_path / "d").as_uri())
    assert isinstance(local, LocalStore) and local.root == (tmp_path / "d").resolve()
    s3 = open_store("s3://bucket/some/prefix/", endpoint_url="http://127.0.0.1:1", **S3_TEST_CREDENTIALS)
    assert isinstance(s3, S3Store) and s3.uri == "s3://bucket/some/prefix/"
    assert s3.object_name("x/y") == "some/prefix/x/y"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string("http://127.0.0.1:1/acct"))
    azure = open_store("az://container")
    assert isinstance(azure, AzureBlobStore) and azure.blob_name("x") == "x"


@pytest.mark.parametrize("uri", ["gs://bucket/x", "file://host/x", "s3:///prefix", "file:///x?y=1", "s3://b/../x"])
def test_open_store_refuses_bad_uris(uri: str) -> None:
    with pytest.raises(StoreConfigError):
        options: dict[str, Any] = {"endpoint_url": "http://127.0.0.1:1"} if uri.startswith("s3") else {}
        open_store(uri, **options)


def test_azure_needs_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(StoreConfigError):
        open_store("az://container/p")
