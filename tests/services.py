"""Pytest plugin: real S3 (moto server) and Azure Blob (Azurite) services on loopback.

Load with ``pytest_plugins = ["tests.services"]`` (or ``pytest -p tests.services``).
Each service starts once per session on a free port and is stopped at the end;
each test gets its own fresh bucket or container. moto accepts any credentials,
so tests of wrong credentials use ``moto_auth_service``, a second moto server
that checks them. The ``blob_store`` fixture
is parametrized over the local directory, S3 and Azure Blob stores.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError
from urllib.request import Request, urlopen

import boto3
import pytest

from cantata.storage import BlobStore, open_store

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 60.0
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
S3_TEST_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


@dataclass(frozen=True)
class RunningService:
    """A started service: its endpoint and its process."""

    endpoint: str
    process: subprocess.Popen


@dataclass(frozen=True)
class AuthenticatingS3:
    """A moto server that checks credentials, and the keys of its one IAM user (allowed every S3 action)."""

    endpoint: str
    access_key_id: str
    secret_access_key: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_ready(process: subprocess.Popen, url: str, name: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode} before becoming ready")
        try:
            urlopen(url, timeout=1).close()
            return
        except URLError as error:
            if getattr(error, "code", None) is not None:
                return  # an HTTP error status: the server is up and answering
        except (ConnectionError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer at {url} within {STARTUP_TIMEOUT_S:.0f} s")


def _start(command: list[str], url: str, name: str, cwd: Path) -> RunningService:
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_ready(process, url, name)
    except BaseException:
        _stop(process)
        raise
    return RunningService(url.rstrip("/"), process)


def stop_service(service: RunningService) -> None:
    """Stop a service (again is fine)."""
    _stop(service.process)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def moto_command(port: int) -> list[str]:
    installed = Path(sys.executable).parent / "moto_server"
    if installed.exists():
        return [str(installed), "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def azurite_command(port: int) -> list[str]:
    local = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
    executable = str(local) if local.exists() else shutil.which("azurite-blob")
    if executable is None:
        raise RuntimeError("azurite-blob not found: run `make test` (it installs Azurite) or `npm install azurite@3`")
    return [
        executable, "--silent", "--inMemoryPersistence", "--blobHost", "127.0.0.1",
        "--blobPort", str(port), "--skipApiVersionCheck",
    ]  # fmt: skip


def start_moto(workdir: Path) -> RunningService:
    port = free_port()
    return _start(moto_command(port), f"http://127.0.0.1:{port}/", "moto_server", workdir)


def start_azurite(workdir: Path) -> RunningService:
    port = free_port()
    return _start(azurite_command(port), f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}", "azurite-blob", workdir)


def azurite_connection_string(endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )


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
def s3_store(moto_service: RunningService, boto3_session: boto3.session.Session) -> BlobStore:
    """An S3 store on a fresh moto bucket."""
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    store = open_store(
        f"s3://{bucket}/ckpt",
        endpoint_url=moto_service.endpoint,
        session=boto3_session,
        retries=1,
        **S3_TEST_CREDENTIALS,
    )
    store.client.create_bucket(Bucket=bucket)
    return store


@pytest.fixture
def azure_store(azurite_service: RunningService) -> BlobStore:
    """An Azure Blob store on a fresh Azurite container."""
    container = f"test-{uuid.uuid4().hex[:20]}"
    store = open_store(
        f"az://{container}/ckpt", connection_string=azurite_connection_string(azurite_service.endpoint), retries=1
    )
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
