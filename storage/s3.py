"""A blob store in an S3 bucket (or an S3-compatible service) through boto3.

Credentials, region and endpoint come from boto3's ordinary configuration
(environment, shared config and credentials files, profiles, instance
roles); keyword overrides take precedence (``session`` reuses a boto3 session
and its loaded service models), and ``endpoint_url`` points the
store at an S3-compatible service such as MinIO or moto (path-style
addressing is then used). Objects up to ``part_size`` go up in one
``PutObject``; larger ones as a multipart upload that is aborted if anything
fails, ``max_concurrency`` of its parts in flight at once.

Transient errors (throttling, 5xx, resets, timeouts) are retried by
botocore's standard retry mode (exponential backoff with jitter), repeated by
:func:`cantata.storage.deadline.within` for ``retry_seconds`` in all; an
explicit ``retries`` count caps the attempts instead. ``outages`` hears once
when the store stops answering and once when it answers again
(:mod:`cantata.storage.outage`). A missing bucket and
refused credentials are permanent (:class:`StoreNotFound`,
:class:`StorePermissionError`) and fail at once. :meth:`S3Store.sweep` aborts
the multipart uploads of writers that died under the store's prefix.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from cantata.storage.base import (
    DEFAULT_ORPHAN_AGE,
    DEFAULT_RETRY_SECONDS,
    BlobNotFoundError,
    BlobReader,
    BlobStore,
    BlobUpload,
    StoreConfigError,
    StoreError,
    StoreNotFound,
    StorePermissionError,
    StoreUnavailableError,
    store_prefix,
    validate_key,
    validate_prefix,
)
from cantata.storage.deadline import within
from cantata.storage.outage import OutageListener, OutageWatch
from cantata.storage.parts import PartSender

T = TypeVar("T")

DEFAULT_PART_SIZE = 8 << 20
MIN_PART_SIZE = 5 << 20
ATTEMPTS_PER_ROUND = 2  # botocore's attempts per call while a time budget governs
READ_CHUNK_SIZE = 1 << 20
_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchUpload", "404", "NotFound"}
_DENIED_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AccountProblem",
    "403",
}


class S3Store(BlobStore):
    """Objects under ``prefix`` in ``bucket``."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        profile_name: str | None = None,
        session: boto3.session.Session | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        max_concurrency: int = 1,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        retries: int | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        outages: OutageListener | None = None,
    ) -> None:
        if not bucket:
            raise StoreConfigError("an S3 store needs a bucket")
        if part_size < MIN_PART_SIZE:
            raise StoreConfigError(f"part_size must be at least {MIN_PART_SIZE} bytes (S3's minimum)")
        self._bucket = bucket
        self._prefix = store_prefix(prefix)
        self._part_size = part_size
        self._concurrency = max_concurrency
        self._budget = retry_seconds if retries is None else 0.0
        self._watch = OutageWatch(self.uri, self._budget, outages)
        attempt_seconds = retry_seconds / ATTEMPTS_PER_ROUND if retries is None else retry_seconds
        config = Config(
            retries={"mode": "standard", "total_max_attempts": ATTEMPTS_PER_ROUND if retries is None else retries + 1},
            connect_timeout=min(connect_timeout, attempt_seconds) or connect_timeout,
            read_timeout=min(read_timeout, attempt_seconds) or read_timeout,
            s3={"addressing_style": "path"} if endpoint_url else None,
            max_pool_connections=max(10, 2 * max_concurrency),
        )
        session = session or boto3.session.Session(profile_name=profile_name)
        self._client = session.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region_name,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            config=config,
        )

    @property
    def uri(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}"

    @property
    def client(self) -> Any:
        """The underlying boto3 S3 client."""
        return self._client

    @property
    def bucket(self) -> str:
        return self._bucket

    def object_name(self, key: str) -> str:
        """The S3 object key that holds ``key``."""
        return self._prefix + validate_key(key)

    def _call(self, action: str, call: Callable[[], T]) -> T:
        """``call()`` with its errors typed, retried while transient for the store's budget."""

        def typed() -> T:
            with _translated_errors(f"{action} in {self.uri}"):
                return call()

        return within(self._budget, typed, self._watch)

    def _start_upload(self, key: str) -> BlobUpload:
        return _S3Upload(self, self.object_name(key))

    def get(self, key: str) -> BlobReader:
        name = self.object_name(key)
        response = self._call(f"reading {name!r}", lambda: self._client.get_object(Bucket=self._bucket, Key=name))
        return _S3Reader(response["Body"], name)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        name = self.object_name(key)

        def ranged() -> bytes:
            try:
                response = self._client.get_object(
                    Bucket=self._bucket, Key=name, Range=f"bytes={offset}-{offset + length - 1}"
                )
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") == "InvalidRange":  # starts past the end
                    return b""
                raise
            return response["Body"].read()

        return self._call(f"reading {name!r} from byte {offset}", ranged)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        full_prefix = self._prefix + validate_prefix(prefix)

        def listed() -> dict[str, int]:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=full_prefix)
            return {
                item["Key"][len(self._prefix) :]: item["Size"] for page in pages for item in page.get("Contents", ())
            }

        return self._call(f"listing {full_prefix!r}", listed)

    def delete(self, key: str) -> None:
        name = self.object_name(key)
        self._call(f"deleting {name!r}", lambda: self._client.delete_object(Bucket=self._bucket, Key=name))

    def sweep(self, older_than: float = DEFAULT_ORPHAN_AGE) -> int:
        """Abort multipart uploads under the store's prefix untouched for more than ``older_than`` seconds.

        An upload is touched when it starts and with each part, so a long
        upload still sending parts is kept.
        """
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than)

        def started_before() -> list[dict[str, Any]]:
            pages = self._client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self._bucket, Prefix=self._prefix
            )
            return [u for page in pages for u in page.get("Uploads", ()) if u["Initiated"] < cutoff]

        def last_touched(upload: dict[str, Any]) -> dt.datetime:
            pages = self._client.get_paginator("list_parts").paginate(
                Bucket=self._bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            return max(
                (part["LastModified"] for page in pages for part in page.get("Parts", ())), default=upload["Initiated"]
            )

        def aborted(upload: dict[str, Any]) -> bool:
            """Abort ``upload`` if it is still untouched since the cutoff."""
            if last_touched(upload) >= cutoff:
                return False
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            return True

        removed = 0
        for upload in self._call("listing multipart uploads", started_before):
            try:
                removed += self._call(f"sweeping the upload of {upload['Key']!r}", partial(aborted, upload))
            except BlobNotFoundError:  # completed or aborted by its writer meanwhile
                continue
        return removed


class _S3Reader(BlobReader):
    def __init__(self, body: Any, name: str) -> None:
        self._body = body
        self._name = name

    def read(self, size: int = -1) -> bytes:
        with _translated_errors(f"reading {self._name!r}"):
            return self._body.read(None if size < 0 else size)

    def close(self) -> None:
        self._body.close()


class _S3Upload(BlobUpload):
    def __init__(self, store: S3Store, name: str) -> None:
        self._store = store
        self._client = store.client
        self._bucket = store.bucket
        self._name = name
        self._part_size = store._part_size
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts = PartSender(self._send_part, store._concurrency, name="s3-part")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buffer += data
        while len(self._buffer) >= self._part_size:
            self._upload_part(bytes(self._buffer[: self._part_size]))
            del self._buffer[: self._part_size]
        return len(data)

    def _upload_part(self, part: bytes) -> None:
        if self._upload_id is None:
            created = self._store._call(
                f"uploading {self._name!r}",
                lambda: self._client.create_multipart_upload(Bucket=self._bucket, Key=self._name),
            )
            self._upload_id = created["UploadId"]
        self._parts.submit(part)

    def _send_part(self, number: int, part: bytes) -> dict[str, Any]:
        response = self._store._call(
            f"uploading {self._name!r}",
            lambda: self._client.upload_part(
                Bucket=self._bucket, Key=self._name, UploadId=self._upload_id, PartNumber=number, Body=part
            ),
        )
        return {"PartNumber": number, "ETag": response["ETag"]}

    def commit(self) -> None:
        action = f"uploading {self._name!r}"
        if self._upload_id is None:
            body = bytes(self._buffer)
            self._store._call(action, lambda: self._client.put_object(Bucket=self._bucket, Key=self._name, Body=body))
            return
        if self._buffer:
            self._upload_part(bytes(self._buffer))
        parts = self._parts.results()
        self._store._call(
            action,
            lambda: self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=self._name,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": parts},
            ),
        )

    def abort(self) -> None:
        self._buffer.clear()
        self._parts.cancel()
        if self._upload_id is not None:
            # The upload is already failing; what this abort cannot reach, S3Store.sweep reclaims later.
            with suppress(BotoCoreError, ClientError):
                self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._name, UploadId=self._upload_id)


@contextmanager
def _translated_errors(action: str) -> Iterator[None]:
    """Map botocore exceptions to the store's typed errors."""
    try:
        yield
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "NoSuchBucket":
            raise StoreNotFound(f"{action}: the bucket does not exist") from error
        if code in _NOT_FOUND_CODES:
            raise BlobNotFoundError(f"{action}: not found") from error
        if code in _DENIED_CODES or status == 403:
            raise StorePermissionError(f"{action}: S3 refused the credentials or the action ({code})") from error
        if status >= 500 or code in {"SlowDown", "ServiceUnavailable", "InternalError"}:
            raise StoreUnavailableError(f"{action}: S3 kept failing ({code})") from error
        raise StoreError(f"{action}: {code or error}") from error
    except (BotoConnectionError, HTTPClientError) as error:
        raise StoreUnavailableError(f"{action}: S3 unreachable ({error})") from error
    except BotoCoreError as error:
        raise StoreError(f"{action}: {error}") from error
