"""A blob store in an S3 bucket (or an S3-compatible service) through boto3.

Credentials, region and endpoint come from boto3's ordinary configuration
(environment, shared config and credentials files, profiles, instance
roles); keyword overrides take precedence (``session`` reuses a boto3 session
and its loaded service models), and ``endpoint_url`` points the
store at an S3-compatible service such as MinIO or moto (path-style
addressing is then used). Objects up to ``part_size`` go up in one
``PutObject``; larger ones as a multipart upload that is aborted if anything
fails. Every request is retried by botocore's standard retry mode
(exponential backoff with jitter on throttling, 5xx and connection errors).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from cantata.storage.base import (
    BlobNotFoundError,
    BlobReader,
    BlobStore,
    BlobUpload,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
    store_prefix,
    validate_key,
    validate_prefix,
)

DEFAULT_PART_SIZE = 8 << 20
MIN_PART_SIZE = 5 << 20
DEFAULT_RETRIES = 4
READ_CHUNK_SIZE = 1 << 20
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}


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
        retries: int = DEFAULT_RETRIES,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
    ) -> None:
        if not bucket:
            raise StoreConfigError("an S3 store needs a bucket")
        if part_size < MIN_PART_SIZE:
            raise StoreConfigError(f"part_size must be at least {MIN_PART_SIZE} bytes (S3's minimum)")
        self._bucket = bucket
        self._prefix = store_prefix(prefix)
        self._part_size = part_size
        config = Config(
            retries={"mode": "standard", "total_max_attempts": retries + 1},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": "path"} if endpoint_url else None,
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

    def _start_upload(self, key: str) -> BlobUpload:
        return _S3Upload(self._client, self._bucket, self.object_name(key), self._part_size)

    def get(self, key: str) -> BlobReader:
        name = self.object_name(key)
        with _translated_errors(f"reading {name!r}"):
            response = self._client.get_object(Bucket=self._bucket, Key=name)
        return _S3Reader(response["Body"], name)

    def list(self, prefix: str = "") -> list[str]:
        full_prefix = self._prefix + validate_prefix(prefix)
        keys: list[str] = []
        with _translated_errors(f"listing {full_prefix!r}"):
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=full_prefix):
                keys.extend(item["Key"][len(self._prefix) :] for item in page.get("Contents", ()))
        return sorted(keys)

    def delete(self, key: str) -> None:
        name = self.object_name(key)
        with _translated_errors(f"deleting {name!r}"):
            self._client.delete_object(Bucket=self._bucket, Key=name)


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
    def __init__(self, client: Any, bucket: str, name: str, part_size: int) -> None:
        self._client = client
        self._bucket = bucket
        self._name = name
        self._part_size = part_size
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buffer += data
        while len(self._buffer) >= self._part_size:
            self._upload_part(bytes(self._buffer[: self._part_size]))
            del self._buffer[: self._part_size]
        return len(data)

    def _upload_part(self, part: bytes) -> None:
        with _translated_errors(f"uploading {self._name!r}"):
            if self._upload_id is None:
                created = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._name)
                self._upload_id = created["UploadId"]
            number = len(self._parts) + 1
            response = self._client.upload_part(
                Bucket=self._bucket, Key=self._name, UploadId=self._upload_id, PartNumber=number, Body=part
            )
        self._parts.append({"PartNumber": number, "ETag": response["ETag"]})

    def commit(self) -> None:
        with _translated_errors(f"uploading {self._name!r}"):
            if self._upload_id is None:
                self._client.put_object(Bucket=self._bucket, Key=self._name, Body=bytes(self._buffer))
                return
            if self._buffer:
                self._upload_part(bytes(self._buffer))
            self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=self._name,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )

    def abort(self) -> None:
        self._buffer.clear()
        if self._upload_id is not None:
            # The upload is already failing; S3 lifecycle rules reap orphaned parts.
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
        if code in _NOT_FOUND_CODES:
            raise BlobNotFoundError(f"{action}: not found") from error
        if status >= 500 or code in {"SlowDown", "ServiceUnavailable", "InternalError"}:
            raise StoreUnavailableError(f"{action}: S3 kept failing ({code})") from error
        raise StoreError(f"{action}: {code or error}") from error
    except (BotoConnectionError, HTTPClientError) as error:
        raise StoreUnavailableError(f"{action}: S3 unreachable ({error})") from error
    except BotoCoreError as error:
        raise StoreError(f"{action}: {error}") from error
