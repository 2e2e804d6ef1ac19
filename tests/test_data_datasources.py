"""Data-source credentials: sealed at rest, scoped to their tenant, never echoed; the service over mutual TLS."""

import base64
import datetime as dt
import sqlite3

import grpc
import pytest

from cantata.proto.v1 import datasources_pb2 as pb
from cantata.proto.v1 import datasources_pb2_grpc
from cantata.security.keys import ENVELOPE_SIZE, LocalKeyring, MasterKey, envelope_key_version
from cantata.security.pki import CertificateAuthority, Principal
from cantata.server.datasource_store import (
    DataSourceExists,
    DataSourceNotFound,
    DataSourceSpec,
    DataSourceStore,
    InvalidDataSource,
    SealedSecretsError,
)
from cantata.server.errors import ErrorInterceptor
from cantata.server.network.serving import ServingLoop
from cantata.server.services.datasources import DataSourcesService
from cantata.trainer.data import DatasetKey, SourceCredentials

SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
S3_SECRETS = {"access_key_id": "AKIAEXAMPLE", "secret_access_key": SECRET_KEY}


def _keyring(path):
    ring = LocalKeyring(path, MasterKey(bytes(range(32))))
    for tenant in ("acme", "globex"):
        ring.ensure_tenant(tenant)
    return ring


@pytest.fixture
def keyring(tmp_path):
    return _keyring(tmp_path / "keyring.sealed")


@pytest.fixture
def sources(tmp_path, keyring):
    store = DataSourceStore(tmp_path / "cantata.db", keyring)
    yield store
    store.close()


def test_secrets_are_encrypted_at_rest_and_reach_the_worker_intact(sources, tmp_path):
    key = bytes(range(100, 132))
    sources.register("acme", DataSourceSpec("corpus", "s3", "http://127.0.0.1:9000", S3_SECRETS, key))
    raw = sqlite3.connect(tmp_path / "cantata.db").execute("SELECT * FROM data_sources").fetchall()
    assert SECRET_KEY.encode() not in repr(raw).encode() and b"AKIAEXAMPLE" not in repr(raw).encode()
    sealed = raw[0][5]
    for secret in (SECRET_KEY.encode(), b"AKIAEXAMPLE", key, base64.b64encode(key)):
        assert secret not in sealed  # the column holds only the wrapped data key and ciphertext
    assert envelope_key_version(sealed[:ENVELOPE_SIZE]) == 1  # wrapped by the tenant's KEK v1
    credentials = SourceCredentials.from_dict(sources.worker_credentials("acme", "corpus"))
    assert (credentials.kind, credentials.endpoint, credentials.secrets) == ("s3", "http://127.0.0.1:9000", S3_SECRETS)
    assert credentials.store_options()["aws_secret_access_key"] == SECRET_KEY
    assert DatasetKey.from_dict(sources.worker_dataset_key("acme", "corpus")) == DatasetKey("acme", key)


def test_names_are_scoped_to_their_tenant(sources):
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    sources.register("globex", DataSourceSpec("corpus", "az", "", {"connection_string": "UseDevelopmentStorage=true"}))
    assert [(r.tenant, r.kind) for r in sources.sources("acme")] == [("acme", "s3")]
    with pytest.raises(DataSourceNotFound, match="data source 'other' not found"):
        sources.worker_credentials("acme", "other")
    sources.delete("globex", "corpus")
    with pytest.raises(DataSourceNotFound):
        sources.worker_credentials("globex", "corpus")
    assert sources.sources("acme")[0].name == "corpus"


def _copy_sealed(db_path, column: str, source: str, target: str) -> None:
    """Overwrite the sealed secrets of the row whose ``column`` is ``target`` with those of ``source``'s row."""
    with sqlite3.connect(db_path) as db:
        sealed = db.execute(f"SELECT sealed FROM data_sources WHERE {column} = ?", (source,)).fetchone()[0]
        db.execute(f"UPDATE data_sources SET sealed = ? WHERE {column} = ?", (sealed, target))


def test_a_row_moved_to_another_tenant_does_not_decrypt(sources, tmp_path):
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    sources.register("globex", DataSourceSpec("corpus", "s3", "", {**S3_SECRETS, "access_key_id": "OTHER"}))
    _copy_sealed(tmp_path / "cantata.db", "tenant", "acme", "globex")
    with pytest.raises(SealedSecretsError, match=r"secrets of data source 'corpus' do not decrypt: .*globex"):
        sources.worker_credentials("globex", "corpus")
    assert SourceCredentials.from_dict(sources.worker_credentials("acme", "corpus")).secrets == S3_SECRETS


def test_a_row_copied_to_another_source_of_the_tenant_does_not_decrypt(sources, tmp_path):
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    sources.register("acme", DataSourceSpec("decoy", "s3", "", {**S3_SECRETS, "access_key_id": "OTHER"}))
    _copy_sealed(tmp_path / "cantata.db", "name", "corpus", "decoy")
    with pytest.raises(SealedSecretsError, match="'decoy' do not decrypt: the row was modified or belongs to another"):
        sources.worker_dataset_key("acme", "decoy")


def test_another_keyring_cannot_open_secrets(sources, tmp_path):
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    other = DataSourceStore(tmp_path / "cantata.db", _keyring(tmp_path / "other-keyring.sealed"))
    with pytest.raises(SealedSecretsError, match="secrets of data source 'corpus' do not decrypt"):
        other.worker_credentials("acme", "corpus")
    other.close()


def test_rotation_rewraps_the_data_keys_and_sources_still_open(sources, keyring):
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS, bytes(range(32))))
    sources.register("globex", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    assert keyring.rotate("acme") == 2
    assert sources.rewrap("acme") == 1 and sources.rewrap("acme") == 0
    assert sources.key_versions_in_use("acme") == {2} and sources.key_versions_in_use("globex") == {1}
    keyring.retire("acme", 1)  # v1's key material is destroyed: only the re-wrapped envelope opens now
    assert SourceCredentials.from_dict(sources.worker_credentials("acme", "corpus")).secrets == S3_SECRETS
    assert DatasetKey.from_dict(sources.worker_dataset_key("acme", "corpus")).secret == bytes(range(32))


def test_duplicate_name_needs_replace(sources):
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    with pytest.raises(DataSourceExists, match="data source 'corpus' already exists"):
        sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    sources.register("acme", DataSourceSpec("corpus", "s3", "", {**S3_SECRETS, "region": "eu-west-1"}), replace=True)
    assert sources.worker_credentials("acme", "corpus")["secrets"]["region"] == "eu-west-1"


@pytest.mark.parametrize(
    "spec, message",
    [
        (("Bad Name", "s3", "", S3_SECRETS), "name:"),
        (("corpus", "gcs", "", S3_SECRETS), "kind:"),
        (("corpus", "s3", "", {"access_key_id": "A"}), "S3 needs access_key_id and secret_access_key"),
        (("corpus", "s3", "http://user:pw@host", S3_SECRETS), "endpoint: an http\\(s\\) URL without user part"),
        (("corpus", "az", "", {"sas_token": "sv=1"}), "endpoint: the account URL is required"),
        (("corpus", "az", "http://h/acct", {"account_key": "k"}), "account_key needs account_name"),
    ],
)
def test_invalid_registrations_name_the_field(spec, message):
    with pytest.raises(InvalidDataSource, match=message):
        DataSourceSpec(*spec)


# ---- the gRPC service over mutual TLS ----------------------------------
@pytest.fixture
def service(tmp_path):
    ca = CertificateAuthority.create()
    hour = dt.timedelta(hours=1)
    server_bundle = ca.issue_bundle(None, dns_names=["localhost"], ips=["127.0.0.1"], lifetime=hour, server=True)
    store = DataSourceStore(tmp_path / "cantata.db", _keyring(tmp_path / "keyring.sealed"))
    audit = []
    serving = ServingLoop(4, "test")
    serving.start()
    server = serving.server(interceptors=[ErrorInterceptor(lambda: "test")])
    datasources_pb2_grpc.add_DataSourcesServicer_to_server(
        DataSourcesService(store, lambda *args, **kwargs: audit.append((args, kwargs))), server
    )
    credentials = grpc.ssl_server_credentials(
        [(server_bundle.key_pem, server_bundle.cert_pem)], root_certificates=ca.cert_pem, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    serving.run(server.start())
    channels = []

    def client(tenant):
        bundle = ca.issue_bundle(Principal.tenant(tenant), lifetime=hour)
        channel = grpc.secure_channel(
            f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca.cert_pem, bundle.key_pem, bundle.cert_pem)
        )
        channels.append(channel)
        return datasources_pb2_grpc.DataSourcesStub(channel)

    yield client, audit
    for channel in channels:
        channel.close()
    serving.run(server.stop(None))
    serving.stop()
    store.close()


def test_service_registers_lists_and_deletes_without_echoing_secrets(service):
    client, audit = service
    acme = client("acme")
    request = pb.RegisterDataSourceRequest(
        name="corpus",
        kind=pb.S3,
        endpoint="http://127.0.0.1:9000",
        s3=pb.S3Credentials(**S3_SECRETS),
        dataset_key=bytes(32),
    )
    info = acme.RegisterDataSource(request)
    assert (info.name, info.kind, info.has_dataset_key) == ("corpus", pb.S3, True)
    listed = acme.ListDataSources(pb.ListDataSourcesRequest())
    assert [s.name for s in listed.sources] == ["corpus"]
    assert SECRET_KEY not in str(listed) + str(info)
    acme.DeleteDataSource(pb.DeleteDataSourceRequest(name="corpus"))
    assert list(acme.ListDataSources(pb.ListDataSourcesRequest()).sources) == []
    assert [args[1] for args, _ in audit] == ["data_source_registered", "data_source_deleted"]
    assert SECRET_KEY not in repr(audit) and "AKIAEXAMPLE" not in repr(audit)


def test_service_hides_another_tenants_source(service):
    client, _ = service
    client("acme").RegisterDataSource(
        pb.RegisterDataSourceRequest(name="corpus", kind=pb.S3, s3=pb.S3Credentials(**S3_SECRETS))
    )
    globex = client("globex")
    assert list(globex.ListDataSources(pb.ListDataSourcesRequest()).sources) == []
    with pytest.raises(grpc.RpcError) as caught:
        globex.DeleteDataSource(pb.DeleteDataSourceRequest(name="corpus"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "data source 'corpus' not found" in caught.value.details()


def test_service_refuses_credentials_of_the_wrong_kind(service):
    client, _ = service
    with pytest.raises(grpc.RpcError) as caught:
        client("acme").RegisterDataSource(
            pb.RegisterDataSourceRequest(name="corpus", kind=pb.AZURE_BLOB, s3=pb.S3Credentials(**S3_SECRETS))
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "credentials: a az source needs azure credentials" in caught.value.details()
