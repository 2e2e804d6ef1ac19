"""The worker config the launcher writes is what ``WorkerConfig.load`` reads: secrets as nested objects, typed once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cantata.security.keys import KeyringError, LocalKeyring, MasterKey
from cantata.server.launcher import worker_secrets
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data import DataError, DatasetKey, SourceCredentials

SECRET = "s3cr3t-access-key-value"


@pytest.fixture
def secrets(tmp_path: Path) -> dict:
    """What the server hands the launcher for one job's workers (``App._worker_secrets``)."""
    keyring = LocalKeyring(tmp_path / "keyring.sealed", MasterKey.create_file(tmp_path / "master.key"))
    keyring.ensure_tenant("acme")
    credentials = SourceCredentials(
        "corpus", "s3", "http://127.0.0.1:9", {"access_key_id": "AK", "secret_access_key": SECRET}
    )
    return {
        "checkpoint_keys": keyring.job_keys("acme", "job-1").to_json(),
        "dataset_roots": [str(tmp_path / "data")],
        "dataset_credentials": credentials.to_json(),
        "dataset_key": DatasetKey("acme", bytes(range(32))).to_json(),
    }


def _write(tmp_path: Path, secret_parts: dict) -> Path:
    config = {
        "job_id": "job-1",
        "tenant": "acme",
        "workers": 2,
        "attempt": 1,
        "server": "127.0.0.1:1",
        "ca": str(tmp_path / "ca.pem"),
        "threads": 1,
        "attack": None,
        "spec": {"name": "x", "steps": 10, "workers": 2, "algorithm": "allreduce"},
        "rendezvous": "tcp://127.0.0.1:2",
        "worker": 1,
        "cert": str(tmp_path / "worker-1.pem"),
        "key": str(tmp_path / "worker-1.key"),
        **secret_parts,
    }
    path = tmp_path / "worker-1.json"
    path.write_text(json.dumps(config))
    return path


def test_secrets_are_nested_objects_parsed_once_into_their_types(tmp_path, secrets):
    parts = worker_secrets(secrets)
    assert isinstance(parts["checkpoint_keys"], dict) and isinstance(parts["data"]["credentials"], dict)
    cfg = WorkerConfig.load(_write(tmp_path, parts))
    assert cfg.checkpoint_keys.tenant == "acme" and cfg.checkpoint_keys.job_id == "job-1"
    assert cfg.checkpoint_keys.current.secret
    access = cfg.dataset_access
    assert access.roots == (tmp_path / "data",)
    assert access.credentials == SourceCredentials.from_json(secrets["dataset_credentials"])
    assert access.dataset_key == DatasetKey("acme", bytes(range(32)))
    assert (cfg.worker, cfg.workers, cfg.spec.algorithm, cfg.ca) == (1, 2, "allreduce", tmp_path / "ca.pem")
    shown = repr(cfg)
    for secret in (SECRET, repr(bytes(range(32))), repr(cfg.checkpoint_keys.current.secret)):
        assert secret not in shown


def test_a_job_without_a_data_source_gets_no_dataset_secrets(tmp_path, secrets):
    del secrets["dataset_credentials"], secrets["dataset_key"]
    cfg = WorkerConfig.load(_write(tmp_path, worker_secrets(secrets)))
    assert cfg.dataset_access.credentials is None and cfg.dataset_access.dataset_key is None


def test_malformed_secrets_are_refused_at_load(tmp_path, secrets):
    parts = worker_secrets(secrets)
    with pytest.raises(KeyringError):
        WorkerConfig.load(_write(tmp_path, {**parts, "checkpoint_keys": {"tenant": "acme"}}))
    with pytest.raises(DataError):
        WorkerConfig.load(_write(tmp_path, {**parts, "data": {**parts["data"], "credentials": {"kind": "s3"}}}))
