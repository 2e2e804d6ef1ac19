"""Data sources from the tenant's side: the SDK and ``cantata data sources`` against a real server."""

from __future__ import annotations

import json
import stat

import grpc
import pytest

from cantata.sdk import Client, Conflict, DataSource, InvalidArgument, NotFound
from cantata.sdk.cli import CommandError, build_parser, cmd_data_sources_rm, data_source_credentials
from cantata.sdk.profiles import Profile
from cantata.server.datasource_store import DataSourceStore
from cantata.trainer.data import DatasetKey, SourceCredentials
from cantata.trainer.data.cli import cmd_prepare
from cantata.trainer.data.sealing import KEY_FILE
from testkit.platform import cli, free_port

ACCESS_KEY = "AKIASDKEXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
S3 = {"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
AZURITE = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=c2VjcmV0;BlobEndpoint=http://h/a"


@pytest.fixture
def server_sources(platform, tenant):
    """The server's own data-source table, opened with its keyring as it is now, to see what it stored."""
    store = DataSourceStore(platform.paths.database, platform.paths.open_keyring())
    yield store
    store.close()


def cli_env(platform, **variables: str) -> dict:
    """The platform's environment without any cloud credentials of the caller's, plus ``variables``."""
    clean = {k: v for k, v in platform.env.items() if not k.startswith(("AWS_", "AZURE_"))}
    return {**clean, **variables}


# ---- the SDK -----------------------------------------------------------
def test_register_list_and_delete_through_the_sdk(platform, tenant):
    s3 = tenant.register_data_source("corpus", kind="s3", endpoint="http://127.0.0.1:9000", credentials=S3)
    assert (s3.name, s3.kind, s3.endpoint, s3.has_dataset_key) == ("corpus", "s3", "http://127.0.0.1:9000", False)
    assert s3.created.endswith("Z")
    tenant.register_data_source(
        "blobs", kind="az", credentials={"connection_string": AZURITE}, dataset_key=bytes(range(32))
    )
    listed = tenant.data_sources()
    assert all(isinstance(s, DataSource) for s in listed)
    assert [(s.name, s.kind, s.has_dataset_key) for s in listed] == [("blobs", "az", True), ("corpus", "s3", False)]
    shown = repr(listed) + platform.server_log()
    assert SECRET_KEY not in shown and ACCESS_KEY not in shown and "c2VjcmV0" not in shown

    tenant.delete_data_source("corpus")
    tenant.delete_data_source("blobs")
    assert tenant.data_sources() == []
    with pytest.raises(NotFound, match="data source 'corpus' not found"):
        tenant.delete_data_source("corpus")


def test_an_existing_name_is_a_conflict_until_replaced(tenant, server_sources):
    tenant.register_data_source("twice", kind="s3", credentials=S3)
    with pytest.raises(Conflict, match="data source 'twice' already exists") as caught:
        tenant.register_data_source("twice", kind="s3", endpoint="https://s3.example.com", credentials=S3)
    assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
    replaced = tenant.register_data_source(
        "twice", kind="s3", endpoint="https://s3.example.com", credentials={**S3, "region": "eu-west-1"}, replace=True
    )
    assert replaced.endpoint == "https://s3.example.com"
    assert [s.endpoint for s in tenant.data_sources() if s.name == "twice"] == ["https://s3.example.com"]
    stored = SourceCredentials.from_dict(server_sources.worker_credentials("acme", "twice"))
    assert stored.secrets == {**S3, "region": "eu-west-1"}
    tenant.delete_data_source("twice")


def test_another_tenant_neither_sees_nor_deletes_a_source(platform, tenant):
    tenant.register_data_source("private", kind="s3", credentials=S3)
    with platform.enroll("globex") as globex:
        assert globex.data_sources() == []
        with pytest.raises(NotFound, match="data source 'private' not found"):
            globex.delete_data_source("private")
        globex.register_data_source("private", kind="az", credentials={"connection_string": AZURITE})
        assert [s.kind for s in globex.data_sources()] == ["az"]
    assert [s.kind for s in tenant.data_sources() if s.name == "private"] == ["s3"]
    tenant.delete_data_source("private")


@pytest.mark.parametrize(
    "kind, credentials, dataset_key, message",
    [
        ("gcs", S3, None, "kind: must be one of s3, az, not 'gcs'"),
        ("s3", {"access_key_id": ACCESS_KEY}, None, "credentials: S3 needs access_key_id and secret_access_key"),
        ("s3", {**S3, "account_key": "k"}, None, r"credentials: unknown fields \['account_key'\] for s3"),
        ("s3", {**S3, "region": 1}, None, r"credentials: \['region'\] must be strings"),
        ("az", {"account_name": "acct"}, None, "credentials: Azure needs connection_string, account_key or sas_token"),
        ("az", {"account_key": "k"}, None, "credentials: account_key needs account_name"),
        ("s3", S3, bytes(16), "dataset_key: must be 32 bytes, not 16"),
    ],
)
def test_bad_registrations_are_refused_before_anything_is_sent(platform, kind, credentials, dataset_key, message):
    nothing_listens = Client(f"127.0.0.1:{free_port()}", ca=platform.ca_pem)  # a sent request would be Unavailable
    with nothing_listens, pytest.raises(InvalidArgument, match=message):
        nothing_listens.register_data_source("corpus", kind=kind, credentials=credentials, dataset_key=dataset_key)


@pytest.mark.parametrize(
    "name, kind, credentials, message",
    [
        ("Bad Name", "s3", S3, "name: 1-63 of a-z"),
        ("corpus", "az", {"sas_token": "sv=1"}, "endpoint: the account URL is required without a connection string"),
    ],
)
def test_the_servers_refusals_are_typed(tenant, name, kind, credentials, message):
    with pytest.raises(InvalidArgument, match=message) as caught:
        tenant.register_data_source(name, kind=kind, credentials=credentials)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and caught.value.request_id


# ---- secrets from the environment ---------------------------------------
@pytest.mark.parametrize(
    "kind, environ, expected",
    [
        (
            "s3",
            {
                "AWS_ACCESS_KEY_ID": "A",
                "AWS_SECRET_ACCESS_KEY": "S",
                "AWS_SESSION_TOKEN": "T",
                "AWS_DEFAULT_REGION": "eu-west-1",
                "AZURE_STORAGE_KEY": "ignored",
            },
            {"access_key_id": "A", "secret_access_key": "S", "session_token": "T", "region": "eu-west-1"},
        ),
        (
            "s3",
            {"AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "S", "AWS_SESSION_TOKEN": ""},
            {"access_key_id": "A", "secret_access_key": "S"},
        ),
        (
            "az",
            {"AZURE_STORAGE_CONNECTION_STRING": "C", "AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "K"},
            {"connection_string": "C"},
        ),
        (
            "az",
            {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "K", "AZURE_STORAGE_SAS_TOKEN": "sv=1"},
            {"account_name": "acct", "account_key": "K"},
        ),
        ("az", {"AZURE_STORAGE_SAS_TOKEN": "sv=1"}, {"sas_token": "sv=1"}),
    ],
)
def test_credentials_come_from_the_conventional_variables(kind, environ, expected):
    assert data_source_credentials(kind, environ) == expected


@pytest.mark.parametrize(
    "kind, environ, message",
    [
        ("s3", {"AWS_ACCESS_KEY_ID": "A"}, "set AWS_SECRET_ACCESS_KEY$"),
        ("s3", {}, "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY$"),
        (
            "az",
            {"AZURE_STORAGE_ACCOUNT": "acct"},
            "AZURE_STORAGE_ACCOUNT is set, set AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN$",
        ),
        (
            "az",
            {"AZURE_STORAGE_KEY": "K"},
            (
                "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY, "
                "or AZURE_STORAGE_SAS_TOKEN$"
            ),
        ),
    ],
)
def test_missing_variables_are_named(kind, environ, message):
    with pytest.raises(CommandError, match=message):
        data_source_credentials(kind, environ)


# ---- the CLI -------------------------------------------------------------
def test_the_data_group_holds_the_sources_and_the_plugin_commands():
    parser, groups = build_parser()
    assert set(groups["data"].choices) == {"sources", "prepare", "upload"}
    assert parser.parse_args(["data", "sources", "rm", "x", "--profile", "acme"]).func is cmd_data_sources_rm
    assert parser.parse_args(["data", "prepare", "text", "--out", "shards"]).func is cmd_prepare


def test_cli_adds_lists_and_removes_with_secrets_from_the_environment(platform, tenant, server_sources):
    env = cli_env(
        platform, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION="eu-west-1"
    )
    added = cli(
        "data",
        "sources",
        "add",
        "cli-s3",
        "--kind",
        "s3",
        "--endpoint",
        "http://127.0.0.1:9000",
        "--profile",
        "acme",
        "--json",
        env=env,
    )
    shown = json.loads(added.stdout)
    assert {k: v for k, v in shown.items() if k != "created"} == {
        "name": "cli-s3",
        "kind": "s3",
        "endpoint": "http://127.0.0.1:9000",
        "has_dataset_key": False,
    }
    stored = SourceCredentials.from_dict(server_sources.worker_credentials("acme", "cli-s3"))
    assert stored.secrets == {**S3, "region": "eu-west-1"}

    listed = cli("data", "sources", "list", "--profile", "acme", env=env)
    assert listed.stdout.split() == ["cli-s3", "s3", "http://127.0.0.1:9000", shown["created"]]
    for output in (added, listed):
        assert SECRET_KEY not in output.stdout + output.stderr and ACCESS_KEY not in output.stdout + output.stderr

    removed = cli("data", "sources", "rm", "cli-s3", "--profile", "acme", env=env)
    assert removed.stdout == "deleted data source cli-s3\n"
    assert "cli-s3" not in [s.name for s in tenant.data_sources()]


def test_cli_names_a_missing_variable_in_one_line(platform, tenant):
    result = cli(
        "data",
        "sources",
        "add",
        "half",
        "--kind",
        "s3",
        "--profile",
        "acme",
        env=cli_env(platform, AWS_ACCESS_KEY_ID=ACCESS_KEY),
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr == ("cantata: error: S3 credentials come from the environment: set AWS_SECRET_ACCESS_KEY\n")
    assert "half" not in [s.name for s in tenant.data_sources()]


def test_cli_sends_the_profiles_dataset_key(platform, tenant, server_sources):
    key_file = Profile.named("acme").folder / KEY_FILE
    assert not key_file.exists()
    added = cli(
        "data",
        "sources",
        "add",
        "sealed",
        "--kind",
        "az",
        "--with-dataset-key",
        "--profile",
        "acme",
        env=cli_env(platform, AZURE_STORAGE_CONNECTION_STRING=AZURITE),
    )
    assert added.stdout.startswith("registered data source sealed") and added.stdout.endswith("dataset key\n")
    assert [s.has_dataset_key for s in tenant.data_sources() if s.name == "sealed"] == [True]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    profile_key = DatasetKey.from_json(key_file.read_text())
    assert profile_key.tenant == "acme"
    assert DatasetKey.from_dict(server_sources.worker_dataset_key("acme", "sealed")) == profile_key
    tenant.delete_data_source("sealed")


# ---- key rotation ----------------------------------------------------------
def test_key_rotation_rewraps_data_sources_and_they_still_open(platform, tenant):
    tenant.register_data_source("rotated", kind="s3", credentials=S3, dataset_key=bytes(range(32)))
    with platform.admin() as admin:
        rotation = admin.rotate_tenant_key("acme", retire_unused=True)
    assert rotation.objects_rewrapped >= 1 and rotation.version - 1 in rotation.retired
    store = DataSourceStore(platform.paths.database, platform.paths.open_keyring())  # the keyring after rotation
    try:
        assert store.key_versions_in_use("acme") == {rotation.version}
        assert SourceCredentials.from_dict(store.worker_credentials("acme", "rotated")).secrets == S3
        assert DatasetKey.from_dict(store.worker_dataset_key("acme", "rotated")).secret == bytes(range(32))
    finally:
        store.close()
    tenant.delete_data_source("rotated")
