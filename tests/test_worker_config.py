"""The worker config the secrets broker and launcher write is what ``WorkerConfig.load`` reads: secrets as nested objects, typed once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2
from cantata.security.keys import KeyringError, LocalKeyring, MasterKey
from cantata.server.database import Database
from cantata.server.datasource_store import DataSourceSpec, DataSourceStore
from cantata.server.store import JobRecord
from cantata.server.workers.secrets_broker import SecretsBroker
from cantata.trainer.config import WorkerConfig
from cantata.trainer.data import DataError, DatasetKey, SourceCredentials
from testkit.fakes import FakeAudit

SECRET = "s3cr3t-access-key-value"
HUB_SECRET = "AccountKey=hub-secret-value"
CREDENTIALS = SourceCredentials(
    "corpus", "s3", "http://127.0.0.1:9", {"access_key_id": "AK", "secret_access_key": SECRET}
)


def _job(dataset: str, init_from: str = "") -> JobRecord:
    spec = common_pb2.JobSpec(name="x", dataset=dataset, init_from=init_from)
    return JobRecord("job-1", "acme", "r" * 8, spec, common_pb2.STARTING, "", 0, 0.0, 0.0, 1, "", "")


@pytest.fixture
def audit() -> FakeAudit:
    return FakeAudit()


@pytest.fixture
def broker(tmp_path: Path, audit: FakeAudit) -> SecretsBroker:
    """The server's secrets broker over a real keyring and data-source store."""
    keyring = LocalKeyring(tmp_path / "keyring.sealed", MasterKey.create_file(tmp_path / "master.key"))
    keyring.ensure_tenant("acme")
    sources = DataSourceStore(Database(tmp_path / "state.db"), keyring)
    spec = DataSourceSpec("corpus", "s3", CREDENTIALS.endpoint, dict(CREDENTIALS.secrets), bytes(range(32)))
    sources.register("acme", spec)
    hub = DataSourceSpec("hub", "az", "http://127.0.0.1:10", {"connection_string": HUB_SECRET}, None)
    sources.register("acme", hub)
    return SecretsBroker(keyring, sources, audit, lambda tenant: [tmp_path / "data" / tenant])


@pytest.fixture
def secrets(broker: SecretsBroker) -> dict:
    """What the broker hands the launcher for the workers of a job reading ``s3://corpus@bucket``."""
    return broker.worker_secrets(_job("s3://corpus@bucket/prefix")).to_dict()


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
    parts = secrets
    assert isinstance(parts["checkpoint_keys"], dict) and isinstance(parts["data"]["credentials"], dict)
    cfg = WorkerConfig.load(_write(tmp_path, parts))
    assert cfg.checkpoint_keys.tenant == "acme" and cfg.checkpoint_keys.job_id == "job-1"
    assert cfg.checkpoint_keys.current.secret
    access = cfg.dataset_access
    assert access.roots == (tmp_path / "data" / "acme",)  # the tenant's own folder of the root
    assert access.credentials == CREDENTIALS
    assert access.dataset_key == DatasetKey("acme", bytes(range(32)))
    assert (cfg.worker, cfg.workers, cfg.spec.algorithm, cfg.ca) == (1, 2, "allreduce", tmp_path / "ca.pem")
    shown = repr(cfg)
    for secret in (SECRET, repr(bytes(range(32))), repr(cfg.checkpoint_keys.current.secret)):
        assert secret not in shown


def test_a_job_without_a_data_source_gets_no_dataset_secrets(tmp_path, broker):
    cfg = WorkerConfig.load(_write(tmp_path, broker.worker_secrets(_job("builtin:pystdlib")).to_dict()))
    assert cfg.dataset_access.credentials is None and cfg.dataset_access.dataset_key is None


def test_malformed_secrets_are_refused_at_load(tmp_path, secrets):
    parts = secrets
    with pytest.raises(KeyringError):
        WorkerConfig.load(_write(tmp_path, {**parts, "checkpoint_keys": {"tenant": "acme"}}))
    with pytest.raises(DataError):
        WorkerConfig.load(_write(tmp_path, {**parts, "data": {**parts["data"], "credentials": {"kind": "s3"}}}))


def test_init_from_s_data_source_is_released_to_the_workers_typed_and_audited_once_per_source(tmp_path, broker, audit):
    cfg = WorkerConfig.load(_write(tmp_path, broker.worker_secrets(_job("s3://corpus@b/p", "az://hub@c/w")).to_dict()))
    access = cfg.dataset_access
    assert access.credentials == CREDENTIALS and access.dataset_key == DatasetKey("acme", bytes(range(32)))
    assert access.init_credentials == SourceCredentials(
        "hub", "az", "http://127.0.0.1:10", {"connection_string": HUB_SECRET}
    )
    assert HUB_SECRET not in repr(cfg)
    released = [(r["resource"], r["details"]["for"], r["details"]["with_shard_decryption"]) for r in audit.records[1:]]
    assert released == [("corpus", ["dataset"], True), ("hub", ["init_from"], False)]

    audit.records.clear()
    cfg = WorkerConfig.load(
        _write(tmp_path, broker.worker_secrets(_job("s3://corpus@b/p", "s3://corpus@b/w")).to_dict())
    )
    assert cfg.dataset_access.init_credentials == cfg.dataset_access.credentials == CREDENTIALS
    assert [(r["resource"], r["details"]["for"]) for r in audit.records[1:]] == [("corpus", ["dataset", "init_from"])]

    cfg = WorkerConfig.load(_write(tmp_path, broker.worker_secrets(_job("builtin:pystdlib", "az://hub@c/w")).to_dict()))
    assert cfg.dataset_access.credentials is None and cfg.dataset_access.dataset_key is None
    assert cfg.dataset_access.init_credentials is not None and cfg.dataset_access.init_credentials.name == "hub"
