"""Dataset URIs and objects: each kind of bad input fails with an error naming the object."""

import json
import os
import uuid

import numpy as np
import pytest

from cantata.storage import open_store
from cantata.trainer.data import (
    DataError,
    DatasetAccessError,
    DatasetKey,
    DatasetNotFoundError,
    DatasetPathError,
    DatasetURI,
    DatasetURIError,
    SealedShardError,
    SourceCredentials,
    TextEncodingError,
    Utf8Policy,
    open_dataset,
)
from cantata.trainer.data.shards import dtype_for, encode_shard
from cantata.trainer.data.upload import upload_shards
from tests.services import AZURITE_ACCOUNT, S3_TEST_CREDENTIALS, azurite_connection_string

BAD_UTF8 = b"caf\xe9 au lait\n"


def _tokens_of(dataset, warnings=None):
    sink = warnings if warnings is not None else []
    return {obj.key: bytes(dataset.tokens(obj, sink.append).astype(np.uint8)) for obj in dataset.objects}


def test_uri_forms_parse_to_typed_parts():
    parsed = DatasetURI.parse("s3://acme-data@bucket/corpus/v1/")
    assert (parsed.scheme, parsed.location, parsed.prefix, parsed.source) == ("s3", "bucket", "corpus/v1", "acme-data")
    assert DatasetURI.parse("az://container/p").source == ""
    with pytest.raises(DatasetURIError, match="unsupported dataset 'gs://b/p'"):
        DatasetURI.parse("gs://b/p")
    with pytest.raises(DatasetURIError, match="must be file:///absolute/path"):
        DatasetURI.parse("file://host/dir")


def test_file_dataset_outside_the_allowed_roots_is_refused(tmp_path):
    root, other = tmp_path / "root", tmp_path / "other"
    root.mkdir(), other.mkdir()
    (other / "a.txt").write_text("hello world " * 100)
    with pytest.raises(DatasetPathError, match=f"dataset {other.as_uri()}: {other} is outside the allowed roots"):
        open_dataset(other.as_uri(), allowed_roots=[root])
    with pytest.raises(DatasetPathError, match="outside the allowed roots"):
        open_dataset(f"file://{root}/../other", allowed_roots=[root])


def test_file_dataset_through_a_symlinked_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.txt").write_text("hello world " * 100)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(DatasetPathError, match=f"{tmp_path / 'link'} is a symbolic link"):
        open_dataset((tmp_path / "link").as_uri(), allowed_roots=[tmp_path])


def test_symlinked_file_inside_the_dataset_is_refused_when_listed_and_when_read(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello world " * 100)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for tenants")
    (data / "b.txt").symlink_to(secret)
    with pytest.raises(DatasetPathError, match=f"{data / 'b.txt'} is a symbolic link"):
        open_dataset(data.as_uri(), allowed_roots=[tmp_path])
    (data / "b.txt").unlink()
    (data / "b.txt").write_text("plain file at listing time")
    dataset = open_dataset(data.as_uri(), allowed_roots=[tmp_path])
    (data / "b.txt").unlink()
    (data / "b.txt").symlink_to(secret)  # swapped for a link after listing
    with pytest.raises(DatasetPathError, match=r"b.txt is a symbolic link"):
        _tokens_of(dataset)


def test_directory_without_data_objects_names_the_directory(tmp_path):
    (tmp_path / "notes.md").write_text("not a data object")
    with pytest.raises(DatasetNotFoundError, match=f"dataset {tmp_path.as_uri()}: no data objects"):
        open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path])


def test_non_utf8_text_is_skipped_with_a_warning_naming_the_file(tmp_path):
    (tmp_path / "good.txt").write_text("hello world")
    (tmp_path / "bad.txt").write_bytes(BAD_UTF8)
    dataset = open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path], utf8_policy=Utf8Policy.SKIP)
    warnings = []
    tokens = _tokens_of(dataset, warnings)
    assert tokens == {"bad.txt": b"", "good.txt": b"hello world"}
    assert warnings == [f"skipped: text file {tmp_path.as_uri()}/bad.txt is not valid UTF-8 (byte 3)"]


def test_non_utf8_text_fails_under_the_fail_policy(tmp_path):
    (tmp_path / "bad.txt").write_bytes(BAD_UTF8)
    dataset = open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path], utf8_policy=Utf8Policy.FAIL)
    with pytest.raises(TextEncodingError, match=r"bad.txt is not valid UTF-8"):
        _tokens_of(dataset)


def test_jsonl_takes_the_text_field_and_skips_bad_records(tmp_path):
    lines = [json.dumps({"text": "première"}).encode(), b'{"text": "caf\xe9"}', json.dumps({"text": "deux"}).encode()]
    (tmp_path / "docs.jsonl").write_bytes(b"\n".join(lines))
    warnings = []
    tokens = _tokens_of(open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path]), warnings)
    assert tokens == {"docs.jsonl": "première\ndeux".encode()}
    assert warnings == [f"skipped: record {tmp_path.as_uri()}/docs.jsonl line 2 is not valid UTF-8 (byte 13)"]


def test_jsonl_record_without_text_names_the_line(tmp_path):
    (tmp_path / "docs.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(TextEncodingError, match=r'docs.jsonl line 2 has no "text" string field'):
        _tokens_of(open_dataset(tmp_path.as_uri(), allowed_roots=[tmp_path]))


def test_empty_s3_prefix_names_the_prefix(s3_store, moto_service):
    bucket = s3_store.bucket
    uri = f"s3://{bucket}/empty/prefix"
    with pytest.raises(
        DatasetNotFoundError, match=f"dataset {uri}: no data objects .* under s3://{bucket}/empty/prefix/"
    ):
        open_dataset(uri, endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS)


def test_missing_s3_bucket_names_the_bucket(moto_service):
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(
        DatasetNotFoundError,
        match=f"listing s3://{bucket}/corpus/: the bucket or container does not exist \\(NoSuchBucket\\)",
    ):
        open_dataset(f"s3://{bucket}/corpus", endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS)


def test_missing_azure_container_names_the_container(azurite_service):
    container = f"missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(DatasetNotFoundError, match=f"listing az://{container}/corpus/"):
        open_dataset(f"az://{container}/corpus", connection_string=azurite_connection_string(azurite_service.endpoint))


def test_wrong_azure_credentials_name_the_store(azure_store, azurite_service):
    azure_store.put("s.tok", encode_shard(np.arange(100) % 256, dtype_for("uint16")))
    container = azure_store.container.container_name
    wrong = SourceCredentials(
        "acme-blob",
        "az",
        f"{azurite_service.endpoint}",
        {"account_name": AZURITE_ACCOUNT, "account_key": "d3Jvbmcta2V5" * 8},
    )
    with pytest.raises(DatasetAccessError, match=f"listing az://{container}/ckpt/: the store refused the credentials"):
        open_dataset(f"az://acme-blob@{container}/ckpt", credentials=wrong, retries=0)


def test_wrong_s3_credentials_name_the_store(moto_auth_service):
    s3 = moto_auth_service
    bucket = f"auth-{uuid.uuid4().hex[:12]}"
    store = open_store(
        f"s3://{bucket}/corpus",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3.access_key_id,
        aws_secret_access_key=s3.secret_access_key,
    )
    store.client.create_bucket(Bucket=bucket)
    store.put("s.tok", encode_shard(np.arange(100) % 256, dtype_for("uint16")))
    uri = f"s3://acme-s3@{bucket}/corpus"
    right = SourceCredentials(
        "acme-s3", "s3", s3.endpoint, {"access_key_id": s3.access_key_id, "secret_access_key": s3.secret_access_key}
    )
    assert [obj.key for obj in open_dataset(uri, credentials=right).objects] == ["s.tok"]
    wrong = SourceCredentials(
        "acme-s3",
        "s3",
        s3.endpoint,
        {"access_key_id": s3.access_key_id, "secret_access_key": "not-" + s3.secret_access_key},
    )
    with pytest.raises(
        DatasetAccessError,
        match=f"listing s3://{bucket}/corpus/: the store refused the credentials \\(SignatureDoesNotMatch\\)",
    ):
        open_dataset(uri, credentials=wrong, retries=0)


def test_named_source_requires_its_credentials():
    with pytest.raises(DataError, match="names data source 'acme-s3', whose credentials were not given"):
        open_dataset("s3://acme-s3@bucket/prefix")
    other = SourceCredentials("acme-s3", "az", "http://127.0.0.1:1", {"sas_token": "x"})
    with pytest.raises(DataError, match="data source 'acme-s3' is az, not s3"):
        open_dataset("s3://acme-s3@bucket/prefix", credentials=other)


def _sealed_dataset(tmp_path, key):
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "a.tok").write_bytes(encode_shard(np.arange(500) % 256, dtype_for("uint16")))
    (prepared / "b.tok").write_bytes(encode_shard(np.arange(700) % 256, dtype_for("uint16")))
    store = open_store((tmp_path / "store").as_uri())
    upload_shards(prepared, store, dataset_key=key)
    return store


def test_encrypted_shard_under_another_tenants_key_is_refused(tmp_path):
    store = _sealed_dataset(tmp_path, DatasetKey.generate("acme"))
    dataset = open_dataset(store.uri, allowed_roots=[tmp_path], dataset_key=DatasetKey.generate("acme"))
    with pytest.raises(SealedShardError, match=f"encrypted shard {store.uri}/a.tok.sealed: data key was not wrapped"):
        _tokens_of(dataset)


def test_encrypted_shards_swapped_between_names_are_refused(tmp_path):
    key = DatasetKey.generate("acme")
    store = _sealed_dataset(tmp_path, key)
    a, b = store.root / "a.tok.sealed", store.root / "b.tok.sealed"
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(a_bytes)
    dataset = open_dataset(store.uri, allowed_roots=[tmp_path], dataset_key=key)
    with pytest.raises(SealedShardError, match=r"a.tok.sealed: object is sealed for .*object=b.tok"):
        _tokens_of(dataset)


def test_encrypted_shards_without_a_key_are_refused_up_front(tmp_path):
    store = _sealed_dataset(tmp_path, DatasetKey.generate("acme"))
    with pytest.raises(DataError, match=f"dataset {store.uri} holds encrypted shards but no dataset key"):
        open_dataset(store.uri, allowed_roots=[tmp_path])


def test_dataset_key_file_is_private_and_reused(tmp_path):
    path = tmp_path / "dataset-key.json"
    first = DatasetKey.load_or_create(path, "acme")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert DatasetKey.load_or_create(path, "acme") == first


def test_builtin_pystdlib_lists_the_standard_library_without_site_packages():
    dataset = open_dataset("builtin:pystdlib")
    keys = [obj.key for obj in dataset.objects]
    assert "json/decoder.py" in keys and all(key.endswith(".py") for key in keys)
    assert not any(key.startswith("site-packages/") for key in keys)
    decoder = next(obj for obj in dataset.objects if obj.key == "json/decoder.py")
    assert b"class JSONDecoder" in bytes(dataset.tokens(decoder, print).astype(np.uint8))
