"""``cantata data upload`` against moto and Azurite: concurrent parts and shards, ``--endpoint``, no partial objects.

Concurrency is shown by an event, not a clock: the first two sends wait for each other at a barrier, which
only a concurrent upload gets past (a serial one would stop at the barrier until the test's ceiling).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import uuid
from pathlib import Path

import pytest
from azure.storage.blob import BlobClient
from botocore.exceptions import ClientError

from cantata.storage import StoreError, open_store
from cantata.trainer.data.prepare import prepare_shards
from cantata.trainer.data.shards import dtype_for
from cantata.trainer.data.upload import upload_shards
from testkit.platform import cli
from tests.services import AZURITE_ACCOUNT, AZURITE_KEY, S3_TEST_CREDENTIALS, azurite_connection_string

pytestmark = pytest.mark.integration
MEET_TIMEOUT = 300.0  # a ceiling, not a measurement: only a serial upload ever waits this long


class Meeting:
    """Wraps a send so that its first ``parties`` calls must all be in flight at once."""

    def __init__(self, send, parties: int = 2):
        self._send = send
        self._barrier = threading.Barrier(parties, timeout=MEET_TIMEOUT)
        self._calls = 0
        self._lock = threading.Lock()
        self.met = False

    def __call__(self, *args, **kwargs):
        with self._lock:
            self._calls += 1
            meet = self._calls <= self._barrier.parties
        if meet:
            self._barrier.wait()  # BrokenBarrierError (the upload fails) if the sends come one at a time
            self.met = True
        return self._send(*args, **kwargs)


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    source = tmp_path / "text.txt"
    source.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(3000)))
    out = tmp_path / "shards"
    result = prepare_shards(source, out, dtype=dtype_for("uint16"), shard_tokens=20_000)
    assert len(result.shards) >= 4
    return out


def _s3(moto_service, **options):
    bucket = f"up-{uuid.uuid4().hex[:16]}"
    store = open_store(f"s3://{bucket}/data", endpoint_url=moto_service.endpoint, **S3_TEST_CREDENTIALS, **options)
    store.client.create_bucket(Bucket=bucket)
    return store


def _azure(azurite_service, **options):
    container = f"up-{uuid.uuid4().hex[:16]}"
    connection = azurite_connection_string(azurite_service.endpoint)
    store = open_store(f"az://{container}/data", connection_string=connection, **options)
    store.container.create_container()
    return store


def test_s3_parts_of_one_object_go_up_concurrently(moto_service, monkeypatch):
    store = _s3(moto_service, part_size=5 << 20, max_concurrency=3)
    meeting = Meeting(store.client.upload_part)
    monkeypatch.setattr(store.client, "upload_part", meeting)
    data = os.urandom((11 << 20) + 123)  # three parts
    store.put("big.bin", data)
    assert meeting.met and store.get_bytes("big.bin") == data


def test_azure_blocks_of_one_blob_go_up_concurrently(azurite_service, monkeypatch):
    store = _azure(azurite_service, block_size=1 << 20, max_concurrency=4)
    meeting = Meeting(BlobClient.stage_block)
    monkeypatch.setattr(BlobClient, "stage_block", lambda client, *a, **kw: meeting(client, *a, **kw))
    data = os.urandom((3 << 20) + 77)  # four blocks
    store.put("big.bin", data)
    assert meeting.met and store.get_bytes("big.bin") == data


def test_a_failed_part_aborts_the_whole_object(moto_service, monkeypatch):
    store = _s3(moto_service, part_size=5 << 20, max_concurrency=3)
    send = store.client.upload_part

    def failing(**kwargs):
        if kwargs["PartNumber"] == 2:
            raise ClientError({"Error": {"Code": "InvalidPart", "Message": "refused"}}, "UploadPart")
        return send(**kwargs)

    monkeypatch.setattr(store.client, "upload_part", failing)
    with pytest.raises(StoreError, match="InvalidPart"):
        store.put("big.bin", os.urandom(11 << 20))
    assert store.list() == []  # nothing half-written under the key
    assert store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []  # and no open upload


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_shards_go_up_concurrently_and_arrive_whole(kind, shards, moto_service, azurite_service, monkeypatch):
    if kind == "s3":
        store = _s3(moto_service, max_concurrency=2)
        meeting = Meeting(store.client.put_object)
        monkeypatch.setattr(store.client, "put_object", meeting)
    else:
        store = _azure(azurite_service, max_concurrency=2)
        meeting = Meeting(BlobClient.upload_blob)
        monkeypatch.setattr(BlobClient, "upload_blob", lambda client, *a, **kw: meeting(client, *a, **kw))
    counted: list[int] = []
    keys = upload_shards(shards, store, jobs=3, on_bytes=counted.append)
    files = sorted(shards.rglob("*.tok"))
    assert meeting.met and keys == [f.relative_to(shards).as_posix() for f in files]
    assert sum(counted) == sum(f.stat().st_size for f in files)  # what the one progress bar counts
    for key, path in zip(keys, files, strict=True):
        assert store.get_bytes(key) == path.read_bytes()


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_the_cli_uploads_through_endpoint(kind, shards, moto_service, azurite_service, tmp_path):
    """``--endpoint`` as for ``data sources add``; credentials from the environment the cloud tools read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_"))}
    env["CANTATA_HOME"] = str(tmp_path / "home")
    if kind == "s3":
        store = _s3(moto_service)
        uri, endpoint = f"s3://{store.bucket}/data", moto_service.endpoint
        env.update(
            AWS_ACCESS_KEY_ID=S3_TEST_CREDENTIALS["aws_access_key_id"],
            AWS_SECRET_ACCESS_KEY=S3_TEST_CREDENTIALS["aws_secret_access_key"],
            AWS_DEFAULT_REGION="us-east-1",
        )
    else:
        store = _azure(azurite_service)
        uri, endpoint = f"az://{store.container.container_name}/data", azurite_service.endpoint
        env.update(AZURE_STORAGE_ACCOUNT=AZURITE_ACCOUNT, AZURE_STORAGE_KEY=AZURITE_KEY)
    result = cli(
        "data", "upload", str(shards), "--store", uri, "--endpoint", endpoint, "--jobs", "3", "--json", env=env
    )
    summary = json.loads(result.stdout)
    files = sorted(shards.rglob("*.tok"))
    assert summary["keys"] == [f.name for f in files] and summary["bytes"] == sum(f.stat().st_size for f in files)
    assert "\r" not in result.stderr  # no bar drawn into redirected output
    for key, path in zip(summary["keys"], files, strict=True):
        assert store.get_bytes(key) == path.read_bytes()
    refused = cli("data", "upload", str(shards), "--store", (tmp_path / "x").as_uri(), "--endpoint", endpoint,
                  env=env, check=False)  # fmt: skip
    assert refused.returncode == 1 and "--endpoint is for s3:// and az://" in refused.stderr


def test_one_progress_bar_on_a_terminal(shards, tmp_path):
    """On a terminal, one bar counts every shard's bytes to the total (redirected output gets none, above)."""
    total = sum(f.stat().st_size for f in shards.rglob("*.tok"))
    main, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    command = [sys.executable, "-m", "cantata.sdk.cli", "data", "upload", str(shards), "--store",
               (tmp_path / "store").as_uri(), "--jobs", "3"]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=terminal) as upload:
        os.close(terminal)
        drawn = b""
        with contextlib.suppress(OSError):  # EIO once the upload has exited and closed the terminal
            while chunk := os.read(main, 4096):
                drawn += chunk
        assert upload.wait() == 0
    os.close(main)
    frames = [frame for frame in drawn.decode().split("\r") if frame.strip()]
    assert frames and all(frame.startswith("upload") for frame in frames)  # one bar, redrawn in place
    assert "100%" in frames[-1] and f"{total / 1000:.0f}k/{total / 1000:.0f}k" in frames[-1]  # every byte
