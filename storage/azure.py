"""A blob store in an Azure Blob Storage container through azure-storage-blob.

The connection comes from, in order: a ``connection_string`` override, an
``account_url`` override (with an optional ``credential``: account key, SAS
token or an azure-identity credential), or the ``AZURE_STORAGE_CONNECTION_STRING``
environment variable that the Azure tools use. Azurite is reached with its
development connection string. An object that fits in one block goes up in
a single Put Blob; larger ones stage blocks and become visible only when the
block list is committed (blocks of an abandoned upload are never committed and
the service discards them after seven days, so there is nothing to sweep);
``max_concurrency`` blocks of one upload are staged at once.

Transient errors (connection errors, timeouts, 408/429/5xx) are retried by
the storage SDK's exponential retry policy for ``retry_seconds`` in all (a
deadline added to it); an explicit ``retries`` count caps the attempts as
well. ``outages`` hears once when the store stops answering and once when it
answers again (:mod:`cantata.storage.outage`). A missing container and refused credentials are
permanent (:class:`StoreNotFound`, :class:`StorePermissionError`).
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobBlock, BlobServiceClient, ContainerClient, ExponentialRetry

from cantata.storage.base import (
    DEFAULT_RETRY_SECONDS,
    BlobNotFoundError,
    BlobReader,
    BlobStore,
    BlobUpload,
    ChunkReader,
    StoreConfigError,
    StoreError,
    StoreNotFound,
    StorePermissionError,
    StoreUnavailableError,
    store_prefix,
    validate_key,
    validate_prefix,
)
from cantata.storage.outage import OutageListener, OutageWatch
from cantata.storage.parts import PartSender

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
DEFAULT_BLOCK_SIZE = 8 << 20
UNCOUNTED_RETRIES = 1_000_000  # no count limit: the time budget ends the retries
FIRST_BACKOFF = 1  # seconds, then 1 + 2**n with up to 1 s of jitter, capped by MAX_BACKOFF and the budget
MAX_BACKOFF = 4.0
RETRIED_STATUSES = {408, 429}  # with 5xx: what the storage SDK's policy retries


class _BudgetedRetry(ExponentialRetry):
    """The storage SDK's exponential retry, ended by a time budget as well as by its count.

    Its policy counts attempts only (azure-core's ``RetryPolicy`` has a
    ``timeout`` but does not fit the storage pipeline), so the budget is
    checked before each retry and caps each backoff. Each retry and each answer
    after it are told to ``watch``.
    """

    def __init__(self, budget: float, retry_total: int, watch: OutageWatch) -> None:
        super().__init__(
            initial_backoff=FIRST_BACKOFF,
            increment_base=2,
            retry_total=retry_total,
            random_jitter_range=FIRST_BACKOFF,
            retry_connect=retry_total,
            retry_read=retry_total,
            retry_status=retry_total,
        )
        self._budget = budget
        self._watch = watch

    def send(self, request: Any) -> Any:
        response = super().send(request)
        status = response.http_response.status_code
        if status < 500 and status not in RETRIED_STATUSES:
            self._watch.answered()
        return response

    def configure_retries(self, request: Any) -> dict[str, Any]:
        settings = super().configure_retries(request)
        settings["deadline"] = time.monotonic() + self._budget
        return settings

    def increment(self, settings: dict[str, Any], request: Any, response: Any = None, error: Any = None) -> bool:
        if time.monotonic() >= settings["deadline"]:
            return False
        retried = bool(super().increment(settings, request, response, error))
        if retried:
            self._watch.failed(
                f"Azure Blob unreachable ({error})" if error else f"Azure Blob answered {response.status_code}"
            )
        return retried

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        remaining = settings["deadline"] - time.monotonic()
        return max(0.0, min(super().get_backoff_time(settings), MAX_BACKOFF, remaining))


class AzureBlobStore(BlobStore):
    """Objects under ``prefix`` in ``container``."""

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        connection_string: str | None = None,
        account_url: str | None = None,
        credential: Any = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_concurrency: int = 1,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        retries: int | None = None,
        connection_timeout: float = 10.0,
        read_timeout: float = 60.0,
        outages: OutageListener | None = None,
    ) -> None:
        if not container:
            raise StoreConfigError("an Azure Blob store needs a container")
        self._prefix = store_prefix(prefix)
        watch = OutageWatch(f"az://{container}/{self._prefix}", retry_seconds, outages)
        self._block_size = block_size
        self._concurrency = max_concurrency
        options: dict[str, Any] = {
            "retry_policy": _BudgetedRetry(retry_seconds, UNCOUNTED_RETRIES if retries is None else retries, watch),
            "connection_timeout": min(connection_timeout, retry_seconds) or connection_timeout,
            "read_timeout": min(read_timeout, retry_seconds) or read_timeout,
            "max_chunk_get_size": block_size,
            "max_single_get_size": block_size,
        }
        connection_string = connection_string or (None if account_url else os.environ.get(CONNECTION_STRING_ENV))
        if connection_string:
            service = BlobServiceClient.from_connection_string(connection_string, **options)
        elif account_url:
            service = BlobServiceClient(account_url, credential=credential, **options)
        else:
            raise StoreConfigError(
                f"no Azure connection: pass connection_string or account_url, or set {CONNECTION_STRING_ENV}"
            )
        self._container: ContainerClient = service.get_container_client(container)

    @property
    def uri(self) -> str:
        return f"az://{self._container.container_name}/{self._prefix}"

    @property
    def container(self) -> ContainerClient:
        """The underlying container client."""
        return self._container

    def blob_name(self, key: str) -> str:
        """The blob name that holds ``key``."""
        return self._prefix + validate_key(key)

    def _start_upload(self, key: str) -> BlobUpload:
        return _AzureUpload(self._container, self.blob_name(key), self._block_size, self.uri, self._concurrency)

    def get(self, key: str) -> BlobReader:
        name = self.blob_name(key)
        with _translated_errors(f"reading {name!r} in {self.uri}"):
            downloader = self._container.download_blob(name)
        return ChunkReader(_translated_chunks(downloader.chunks(), f"{name!r} in {self.uri}"))

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        name = self.blob_name(key)
        with _translated_errors(f"reading {name!r} from byte {offset} in {self.uri}"):
            try:
                return self._container.download_blob(name, offset=offset, length=length).readall()
            except HttpResponseError as error:
                if error.status_code == 416:  # starts past the end
                    return b""
                raise

    def sizes(self, prefix: str = "") -> dict[str, int]:
        full_prefix = self._prefix + validate_prefix(prefix)
        with _translated_errors(f"listing {full_prefix!r} in {self.uri}"):
            return {
                blob.name[len(self._prefix) :]: blob.size
                for blob in self._container.list_blobs(name_starts_with=full_prefix)
            }

    def delete(self, key: str) -> None:
        name = self.blob_name(key)
        try:
            with _translated_errors(f"deleting {name!r} in {self.uri}"):
                self._container.delete_blob(name)
        except BlobNotFoundError:
            return


class _AzureUpload(BlobUpload):
    def __init__(self, container: ContainerClient, name: str, block_size: int, uri: str, concurrency: int) -> None:
        self._blob = container.get_blob_client(name)
        self._action = f"uploading {name!r} in {uri}"
        self._block_size = block_size
        self._upload_id = uuid.uuid4().hex
        self._buffer = bytearray()
        self._blocks = PartSender(self._stage_block, concurrency, name="az-block")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buffer += data
        while len(self._buffer) >= self._block_size:
            self._stage(bytes(self._buffer[: self._block_size]))
            del self._buffer[: self._block_size]
        return len(data)

    def _stage(self, block: bytes) -> None:
        self._blocks.submit(block)

    def _stage_block(self, number: int, block: bytes) -> str:
        block_id = base64.b64encode(f"{self._upload_id}-{number - 1:08d}".encode()).decode()
        with _translated_errors(self._action):
            self._blob.stage_block(block_id, block, length=len(block))
        return block_id

    def commit(self) -> None:
        with _translated_errors(self._action):
            if not self._blocks.count:
                self._blob.upload_blob(bytes(self._buffer), length=len(self._buffer), overwrite=True)
                return
        if self._buffer:
            self._stage(bytes(self._buffer))
        block_ids = self._blocks.results()
        with _translated_errors(self._action):
            self._blob.commit_block_list([BlobBlock(block_id) for block_id in block_ids])

    def abort(self) -> None:
        self._buffer.clear()
        self._blocks.cancel()


def _translated_chunks(chunks: Iterator[bytes], what: str) -> Iterator[bytes]:
    with _translated_errors(f"reading {what}"):
        yield from chunks


@contextmanager
def _translated_errors(action: str) -> Iterator[None]:
    """Map azure-core exceptions to the store's typed errors."""
    try:
        yield
    except ResourceNotFoundError as error:
        if getattr(error, "error_code", None) == "ContainerNotFound":  # set by azure-storage, not azure-core
            raise StoreNotFound(f"{action}: the container does not exist") from error
        raise BlobNotFoundError(f"{action}: not found") from error
    except ClientAuthenticationError as error:
        raise StorePermissionError(f"{action}: Azure Blob refused the credentials ({error.reason or error})") from error
    except (ServiceRequestError, ServiceResponseError) as error:
        raise StoreUnavailableError(f"{action}: Azure Blob unreachable ({error})") from error
    except HttpResponseError as error:
        if (error.status_code or 0) >= 500 or error.status_code in (408, 429):
            raise StoreUnavailableError(f"{action}: Azure Blob kept failing ({error.status_code})") from error
        if error.status_code in (401, 403):
            raise StorePermissionError(f"{action}: Azure Blob refused the action ({error.reason or error})") from error
        raise StoreError(f"{action}: {error.reason or error}") from error
    except AzureError as error:
        raise StoreError(f"{action}: {error}") from error
