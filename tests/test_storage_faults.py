"""Stores under faults: real moto and Azurite behind a fault proxy, a full tmpfs, writers killed mid-upload.

Transient faults shorter than a store's ``retry_seconds`` are survived;
longer ones fail as :class:`StoreUnavailableError` (``UNAVAILABLE``) after
about the budget; permanent ones (missing bucket or container, refused
credentials, a full disk) fail at once with their own error and gRPC code;
orphaned uploads older than the threshold are swept and fresh ones kept.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import grpc
import pytest

from cantata.sdk import errors as sdk_errors
from cantata.sdk.job import Job
from cantata.server.errors import status_of
from cantata.server.store import Store
from cantata.server.sweeper import OrphanSweeper
from cantata.storage import (
    BlobStore,
    StoreFull,
    StoreNotFound,
    StorePermissionError,
    StoreUnavailableError,
    open_store,
)
from cantata.storage.azure import AzureBlobStore
from cantata.storage.local import PARTIAL_DIR, LocalStore
from cantata.storage.outage import OutageListener
from cantata.storage.s3 import MIN_PART_SIZE, S3Store
from testkit.platform import Platform
from testkit.waiting import wait_for
from tests.faultproxy import FaultProxy
from tests.outages import HeardOutages
from tests.services import (
    AZURITE_ACCOUNT,
    S3_TEST_CREDENTIALS,
    AuthenticatingS3,
    RunningService,
    azurite_connection_string,
)

pytestmark = pytest.mark.integration

BUDGET = 20.0  # long enough to outlast the short faults below on a loaded machine
SHORT_BUDGET = 2.0  # for outages that must outlast it
FAULT_SECONDS = 2.0
DATA = os.urandom(256 << 10)


def _port(endpoint: str) -> int:
    port = urlsplit(endpoint).port
    assert port is not None
    return port


def _code(exc: Exception) -> grpc.StatusCode:
    status = status_of(exc, request_id="rid")
    assert status is not None, f"{type(exc).__name__} is not mapped to a gRPC status"
    return status.code


@pytest.fixture
def s3_bucket(moto_service: RunningService) -> str:
    bucket = f"faults-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def azure_container(azurite_service: RunningService) -> str:
    container = f"faults-{uuid.uuid4().hex[:16]}"
    store = open_store(f"az://{container}", connection_string=azurite_connection_string(azurite_service.endpoint))
    assert isinstance(store, AzureBlobStore)
    store.container.create_container()
    return container


@pytest.fixture(params=["s3", "azure"])
def remote(request: pytest.FixtureRequest) -> Iterator[tuple[str, FaultProxy, object]]:
    """A remote store kind, a fault proxy in front of its emulator, and how to open a store through it."""
    kind = request.param
    if kind == "s3":
        service = request.getfixturevalue("moto_service")
        bucket = request.getfixturevalue("s3_bucket")
        proxy = FaultProxy(_port(service.endpoint))

        def opened(budget: float, outages: OutageListener | None = None) -> BlobStore:
            return open_store(
                f"s3://{bucket}/ckpt",
                endpoint_url=proxy.endpoint,
                retry_seconds=budget,
                outages=outages,
                **S3_TEST_CREDENTIALS,
            )
    else:
        service = request.getfixturevalue("azurite_service")
        container = request.getfixturevalue("azure_container")
        proxy = FaultProxy(_port(service.endpoint))

        def opened(budget: float, outages: OutageListener | None = None) -> BlobStore:
            endpoint = f"{proxy.endpoint}/{AZURITE_ACCOUNT}"
            return open_store(
                f"az://{container}/ckpt",
                connection_string=azurite_connection_string(endpoint),
                retry_seconds=budget,
                outages=outages,
            )

    yield kind, proxy, opened
    proxy.close()


# ---- transient faults -------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["reset", "stall", "refuse"])
def test_a_fault_shorter_than_the_budget_is_survived(remote, fault: str) -> None:
    _, proxy, opened = remote
    store = opened(BUDGET)
    store.put("before", b"x")  # a pooled connection that the fault then cuts or stalls
    proxy.set(fault, for_seconds=FAULT_SECONDS)
    started = time.monotonic()
    store.put("obj", DATA)
    assert time.monotonic() - started >= FAULT_SECONDS  # it went through only once the fault was over
    assert store.get_bytes("obj") == DATA
    if fault == "reset":
        assert proxy.resets > 0


@pytest.mark.parametrize("fault", ["refuse", "stall"])
def test_an_outage_longer_than_the_budget_fails_as_unavailable_after_about_the_budget(remote, fault: str) -> None:
    _, proxy, opened = remote
    store = opened(SHORT_BUDGET)
    store.list()
    proxy.set(fault)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        store.put("obj", DATA)
    elapsed = time.monotonic() - started
    assert SHORT_BUDGET <= elapsed < 3 * SHORT_BUDGET + 2, elapsed
    assert _code(caught.value) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("fault", ["refuse", "reset"])
def test_an_outage_is_told_once_while_it_lasts_and_once_when_it_ends(remote, fault: str) -> None:
    _, proxy, opened = remote
    heard = HeardOutages()
    store = opened(BUDGET, heard)
    store.put("before", b"x")
    assert heard.events == []  # a store that answers has no outage to tell
    proxy.set(fault)
    with ThreadPoolExecutor(1) as pool:
        putting = pool.submit(store.put, "obj", DATA)
        began = heard.wait_for("unreachable")
        assert not putting.done()  # told while the call is still being retried
        proxy.set("pass")
        putting.result()
    assert store.get_bytes("obj") == DATA
    assert [event.what for event in heard.events] == ["unreachable", "reachable"]  # once each, not once per retry
    assert began.store == store.uri and began.retry_for == BUDGET
    assert "unreachable" in began.cause
    assert heard.events[1].store == store.uri and heard.events[1].seconds > 0


def test_an_outage_past_the_budget_is_told_and_still_fails_as_unavailable(remote) -> None:
    _, proxy, opened = remote
    heard = HeardOutages()
    store = opened(SHORT_BUDGET, heard)
    store.list()
    proxy.set("refuse")
    with pytest.raises(StoreUnavailableError):
        store.put("obj", DATA)
    assert [event.what for event in heard.events] == ["unreachable"]  # no end is told: it did not end


# ---- permanent errors -------------------------------------------------------------------------
def _fails_fast(call, error: type[Exception]) -> Exception:
    started = time.monotonic()
    with pytest.raises(error) as caught:
        call()
    assert time.monotonic() - started < BUDGET / 4, "a permanent error was retried"
    return caught.value


def test_a_missing_bucket_or_container_is_permanent(moto_service: RunningService, azurite_service) -> None:
    s3 = open_store(
        "s3://no-such-bucket/p", endpoint_url=moto_service.endpoint, retry_seconds=BUDGET, **S3_TEST_CREDENTIALS
    )
    azure = open_store(
        "az://no-such-container/p",
        connection_string=azurite_connection_string(azurite_service.endpoint),
        retry_seconds=BUDGET,
    )
    for store in (s3, azure):
        for call in (lambda s=store: s.put("k", b"x"), lambda s=store: s.list(), lambda s=store: s.get_bytes("k")):
            exc = _fails_fast(call, StoreNotFound)
            assert _code(exc) == grpc.StatusCode.FAILED_PRECONDITION
            assert store.uri.split("/")[2] in str(exc)


def test_wrong_credentials_are_permanent(moto_auth_service: AuthenticatingS3, azurite_service) -> None:
    bucket = f"auth-{uuid.uuid4().hex[:12]}"
    good: dict[str, Any] = {"aws_access_key_id": moto_auth_service.access_key_id}
    owner = open_store(
        f"s3://{bucket}",
        endpoint_url=moto_auth_service.endpoint,
        aws_secret_access_key=moto_auth_service.secret_access_key,
        **good,
    )
    assert isinstance(owner, S3Store)
    owner.client.create_bucket(Bucket=bucket)
    wrong_secret = open_store(
        f"s3://{bucket}",
        endpoint_url=moto_auth_service.endpoint,
        aws_secret_access_key="not-the-secret",
        retry_seconds=BUDGET,
        **good,
    )
    unknown_key = open_store(
        f"s3://{bucket}",
        endpoint_url=moto_auth_service.endpoint,
        aws_access_key_id="AKIANOTAKNOWNKEY0000",
        aws_secret_access_key="whatever",
        retry_seconds=BUDGET,
    )
    wrong_key = azurite_connection_string(azurite_service.endpoint).replace("AccountKey=", "AccountKey=" + "A" * 8, 1)
    azure = open_store("az://any-container/p", connection_string=wrong_key, retry_seconds=BUDGET)
    for store in (wrong_secret, unknown_key, azure):
        exc = _fails_fast(lambda s=store: s.put("k", b"x"), StorePermissionError)
        assert _code(exc) == grpc.StatusCode.PERMISSION_DENIED


# ---- a full local store -----------------------------------------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_local_store_names_the_store_and_leaves_nothing(small_tmpfs: Path) -> None:
    store = open_store((small_tmpfs / "store").as_uri())
    store.put("fits", b"small")
    with pytest.raises(StoreFull) as caught:
        store.put("ckpt/big", os.urandom(2 << 20))
    message = str(caught.value)
    assert store.uri in message and str(small_tmpfs / "store" / "ckpt" / "big") in message
    assert _code(caught.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert list((small_tmpfs / "store" / PARTIAL_DIR).iterdir()) == []
    assert store.list() == ["fits"]
    store.put("after", b"space is back")  # the failed upload freed what it took
    assert store.get_bytes("after") == b"space is back"


# ---- orphans ----------------------------------------------------------------------------------
_KILLED_WRITER = """
import os, signal, sys
from cantata.storage import open_store
with open_store(sys.argv[1]).writer("ckpt/model") as upload:
    upload.write(os.urandom(4 << 20))
    upload.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_writer(uri: str) -> None:
    result = subprocess.run([sys.executable, "-c", _KILLED_WRITER, uri], capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()


def test_a_killed_writers_partial_file_is_swept_and_a_fresh_one_kept(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _killed_writer(root.as_uri())
    _killed_writer(root.as_uri())
    old, fresh = sorted((root / PARTIAL_DIR).iterdir())
    assert old.stat().st_size == fresh.stat().st_size == 4 << 20
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))  # as if its writer had been killed two hours ago
    store = LocalStore(root)
    assert store.sweep() == 1  # older than the default hour
    assert not old.exists() and fresh.exists()
    assert store.sweep(older_than=3600) == 0
    assert store.list() == []


def _last_part_at(client, bucket: str, key: str, upload_id: str) -> dt.datetime:
    return client.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)["Parts"][-1]["LastModified"]


def test_s3_multipart_uploads_older_than_the_threshold_are_aborted(
    moto_service: RunningService, s3_bucket: str
) -> None:
    store = open_store(f"s3://{s3_bucket}/tenants", endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS)
    assert isinstance(store, S3Store)
    client = store.client

    def started(key: str) -> str:
        upload_id = client.create_multipart_upload(Bucket=s3_bucket, Key=key)["UploadId"]
        client.upload_part(Bucket=s3_bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"p" * MIN_PART_SIZE)
        return upload_id

    old = started("tenants/acme/job/ckpt/model")
    outside = started("elsewhere/model")  # not under the store's prefix: not the store's to sweep
    threshold = 2.0  # S3 times its parts to the second
    old_at = _last_part_at(client, s3_bucket, "tenants/acme/job/ckpt/model", old)
    wait_for(lambda: dt.datetime.now(dt.UTC) - old_at > dt.timedelta(seconds=threshold + 1))
    fresh = started("tenants/acme/job/ckpt/optimizer")

    assert store.sweep(older_than=threshold) == 1
    left = {u["UploadId"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])}
    assert left == {fresh, outside}


def test_the_server_sweeper_cleans_its_stores(tmp_path: Path) -> None:
    default = tmp_path / "checkpoints"
    _killed_writer(default.as_uri())
    (orphan,) = (default / PARTIAL_DIR).iterdir()
    sweeper = OrphanSweeper(Store(tmp_path / "state.db"), default.as_uri(), older_than=0.0, interval=600)
    assert sweeper.store_uris() == [default.as_uri()]
    assert sweeper.sweep() == 1
    assert not orphan.exists()


# ---- the server -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, moto_service: RunningService) -> Iterator[Platform]:
    """A server whose S3 stores are on moto, started with a killed writer's partial file in its default store."""
    aws = {
        "AWS_ENDPOINT_URL": moto_service.endpoint,
        "AWS_DEFAULT_REGION": S3_TEST_CREDENTIALS["region_name"],
        "AWS_ACCESS_KEY_ID": S3_TEST_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": S3_TEST_CREDENTIALS["aws_secret_access_key"],
    }
    p = Platform(tmp_path_factory.mktemp("platform"), env=aws)
    _killed_writer(p.paths.checkpoints.as_uri())
    (orphan,) = (p.paths.checkpoints / PARTIAL_DIR).iterdir()
    hours_ago = time.time() - 2 * 3600
    os.utime(orphan, (hours_ago, hours_ago))
    p.start()
    yield p
    p.stop()


def test_the_server_sweeps_its_default_store_when_it_starts(platform: Platform) -> None:
    partials = platform.paths.checkpoints / PARTIAL_DIR
    wait_for(lambda: not any(partials.iterdir()))
    assert "removed 1 orphaned upload(s)" in platform.server_log()


def test_a_jobs_missing_bucket_is_a_failed_precondition_not_unavailable(tenant) -> None:
    handle = tenant.submit(Job(name="nowhere", checkpoint_store="s3://no-such-bucket/ckpt", steps=1))
    try:
        with pytest.raises(sdk_errors.CantataError) as caught:
            tenant.checkpoints(handle.id)
        assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "no-such-bucket" in str(caught.value) and "does not exist" in str(caught.value)
    finally:
        handle.cancel()
