"""Pytest plugin: fixtures for real S3 (moto server) and Azure Blob (Azurite) services on loopback.

Load with ``pytest_plugins = ["tests.services"]`` (or ``pytest -p tests.services``).
The services are started by ``emulators`` (shared with the benchmarks); each
starts once per session and is stopped at the end, and each test gets its own
fresh bucket or container. moto accepts any credentials, so tests of wrong
credentials use ``moto_auth_service``, a second moto server that checks them.
The ``blob_store`` fixture is parametrized over the local directory, S3 and
Azure Blob stores.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.request import Request, urlopen

import boto3
import pytest

from cantata.storage import BlobStore, open_store
from cantata.storage.azure import AzureBlobStore
from cantata.storage.s3 import S3Store
from emulators import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    S3_TEST_CREDENTIALS,
    RunningService,
    azurite_connection_string,
    free_port,
    start_azurite,
    start_moto,
    stop_service,
)

# Test modules import these names from here; they are defined in ``emulators``.
__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "S3_TEST_CREDENTIALS",
    "AuthenticatingS3",
    "RunningService",
    "azurite_connection_string",
    "free_port",
    "start_moto",
    "stop_service",
]


@dataclass(frozen=True)
class AuthenticatingS3:
    """A moto server that checks credentials, and the keys of its one IAM user (allowed every S3 action)."""

    endpoint: str
    access_key_id: str
    secret_access_key: str


@pytest.fixture(scope="session")
def moto_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    service = start_moto(tmp_path_factory.mktemp("moto"))
    yield service
    stop_service(service)


@pytest.fixture(scope="session")
def moto_auth_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthenticatingS3]:
    service = start_moto(tmp_path_factory.mktemp("moto-auth"))
    iam = boto3.client("iam", endpoint_url=service.endpoint, **S3_TEST_CREDENTIALS)
    iam.create_user(UserName="tenant")
    iam.put_user_policy(
        UserName="tenant",
        PolicyName="s3",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        ),
    )
    key = iam.create_access_key(UserName="tenant")["AccessKey"]
    # From now on every request must be signed by a known key (moto's INITIAL_NO_AUTH_ACTION_COUNT, set to 0).
    urlopen(
        Request(
            f"{service.endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        ),
        timeout=10,
    ).close()
    yield AuthenticatingS3(service.endpoint, key["AccessKeyId"], key["SecretAccessKey"])
    stop_service(service)


@pytest.fixture(scope="session")
def azurite_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    service = start_azurite(tmp_path_factory.mktemp("azurite"))
    yield service
    stop_service(service)


@pytest.fixture(scope="session")
def boto3_session() -> boto3.session.Session:
    """One boto3 session for every test store, so service models load once."""
    return boto3.session.Session()


@pytest.fixture
def s3_store(moto_service: RunningService, boto3_session: boto3.session.Session) -> S3Store:
    """An S3 store on a fresh moto bucket."""
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    store = open_store(
        f"s3://{bucket}/ckpt",
        endpoint_url=moto_service.endpoint,
        session=boto3_session,
        retries=1,
        **S3_TEST_CREDENTIALS,
    )
    assert isinstance(store, S3Store)
    store.client.create_bucket(Bucket=bucket)
    return store


@pytest.fixture
def azure_store(azurite_service: RunningService) -> AzureBlobStore:
    """An Azure Blob store on a fresh Azurite container."""
    container = f"test-{uuid.uuid4().hex[:20]}"
    store = open_store(
        f"az://{container}/ckpt", connection_string=azurite_connection_string(azurite_service.endpoint), retries=1
    )
    assert isinstance(store, AzureBlobStore)
    store.container.create_container()
    return store


@pytest.fixture
def local_store(tmp_path: Path) -> BlobStore:
    """A store in a fresh temporary directory."""
    return open_store((tmp_path / "store").as_uri())


@pytest.fixture(params=["local", "s3", "azure"])
def blob_store(request: pytest.FixtureRequest) -> BlobStore:
    """Each of the three stores in turn."""
    return request.getfixturevalue(f"{request.param}_store")
