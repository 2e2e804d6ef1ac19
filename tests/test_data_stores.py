"""Datasets prepared and uploaded with the ``cantata data`` commands, then streamed from each store."""

import argparse
import json

import numpy as np
import pytest
import torch

from cantata.storage import open_store
from cantata.trainer.data import DataLoader, DatasetKey, SourceCredentials, open_dataset
from cantata.trainer.data.cli import register
from tests.services import AZURITE_ACCOUNT, AZURITE_KEY, S3_TEST_CREDENTIALS

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400))


def cantata_data(argv, capsys):
    """Run ``cantata data ...`` as the CLI plugin registers it; return its JSON output."""
    parser = argparse.ArgumentParser(prog="cantata")
    data = parser.add_subparsers(dest="command", required=True).add_parser("data")
    register({"data": data.add_subparsers(dest="sub", required=True)})
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def prepared(tmp_path, capsys):
    source = tmp_path / "text"
    source.mkdir()
    (source / "a.txt").write_text(TEXT[: len(TEXT) // 2])
    (source / "b.jsonl").write_text(json.dumps({"text": TEXT[len(TEXT) // 2 :]}) + "\n")
    out = tmp_path / "shards"
    summary = cantata_data(
        ["data", "prepare", str(source), "--out", str(out), "--shard-tokens", "4000", "--json"], capsys
    )
    assert summary["tokens"] == len(TEXT) and summary["files"] == 2 and len(summary["shards"]) == 6
    return out


def _credentials(kind, store, service):
    if kind == "s3":
        secrets = {
            "access_key_id": S3_TEST_CREDENTIALS["aws_access_key_id"],
            "region": "us-east-1",
            "secret_access_key": S3_TEST_CREDENTIALS["aws_secret_access_key"],
        }
        return SourceCredentials("acme-src", "s3", service.endpoint, secrets), f"s3://acme-src@{store.bucket}/data"
    secrets = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
    container = store.container.container_name
    return SourceCredentials("acme-src", "az", service.endpoint, secrets), f"az://acme-src@{container}/data"


def _stream_text(dataset, batches):
    with DataLoader(dataset, batch_size=4, seq_len=32, seed=9, rank=0, world=1) as loader:
        rows = torch.cat([loader.next_batch().inputs for _ in range(batches)])
    return [bytes(row.tolist()).decode() for row in rows]


@pytest.mark.parametrize("encrypted", [False, True], ids=["raw", "encrypted"])
@pytest.mark.parametrize(
    "kind",
    ["local", pytest.param("s3", marks=pytest.mark.integration), pytest.param("az", marks=pytest.mark.integration)],
)
def test_uploaded_dataset_streams_the_prepared_text(kind, encrypted, prepared, tmp_path, capsys, monkeypatch, request):
    monkeypatch.setenv("CANTATA_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "profiles" / "acme").mkdir(parents=True)
    options, credentials = {}, None
    if kind == "local":
        uri = (tmp_path / "store").as_uri()
        dataset_uri = uri
        options["allowed_roots"] = [tmp_path]
    else:
        store = request.getfixturevalue("s3_store" if kind == "s3" else "azure_store")
        service = request.getfixturevalue("moto_service" if kind == "s3" else "azurite_service")
        credentials, dataset_uri = _credentials(kind, store, service)
        uri = dataset_uri.replace("acme-src@", "")
        for name, value in credentials.store_options().items():  # the tenant's ambient configuration
            if name == "endpoint_url":
                monkeypatch.setenv("AWS_ENDPOINT_URL", value)
            elif name.startswith("aws_") and value:
                monkeypatch.setenv(name.upper(), value)
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={credentials.endpoint};",
        )
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    flags = ["--encrypt", "--profile", "acme"] if encrypted else []
    uploaded = cantata_data(["data", "upload", str(prepared), "--store", uri, *flags, "--json"], capsys)
    suffix = ".tok.sealed" if encrypted else ".tok"
    assert uploaded["keys"] == [f"shard-{i:05d}{suffix}" for i in range(6)]

    if encrypted:
        key = DatasetKey.from_json((tmp_path / "home" / "profiles" / "acme" / "dataset-key.json").read_text())
        options["dataset_key"] = key
        stored = open_store(uri, **(credentials.store_options() if credentials else {}))
        assert TEXT[:64].encode() not in stored.get_bytes("shard-00000.tok.sealed")
    dataset = open_dataset(dataset_uri, credentials=credentials, **options)
    assert [obj.key for obj in dataset.objects] == uploaded["keys"]
    assert sum(dataset.tokens(obj, print).size for obj in dataset.objects) == len(TEXT)
    for window in _stream_text(dataset, 10):
        assert window in TEXT


def test_streams_match_across_stores(prepared, tmp_path, s3_store, moto_service):
    from cantata.trainer.data.upload import upload_shards

    local = open_store((tmp_path / "local").as_uri())
    upload_shards(prepared, local)
    upload_shards(prepared, s3_store)
    from_local = open_dataset(local.uri, allowed_roots=[tmp_path])
    from_s3 = open_dataset(s3_store.uri, endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS)
    assert _stream_text(from_local, 12) == _stream_text(from_s3, 12)
    assert len(set(_stream_text(from_local, 12))) > 40
    assert np.array_equal(from_local.tokens(from_local.objects[2], print), from_s3.tokens(from_s3.objects[2], print))
