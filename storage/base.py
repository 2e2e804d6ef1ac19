"""The blob-store interface shared by the local, S3 and Azure Blob stores.

A store maps ``/``-separated keys to immutable byte objects. Writes stream
through :meth:`BlobStore.writer` (or :meth:`BlobStore.put`, which copies a
file-like object or an iterable of chunks into one) and are *atomic*: a
reader sees either the previous object under a key or the complete new one,
never a partial upload. An upload interrupted by an exception is aborted and
leaves nothing behind under its key.

Errors are typed by what a caller should do: :class:`StoreUnavailableError`
is transient (the store already retried it for its ``retry_seconds``
budget); :class:`StoreNotFound`, :class:`StorePermissionError` and
:class:`StoreFull` are permanent until an operator acts, and are never
retried. :meth:`BlobStore.sweep` reclaims what killed writers left behind.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

COPY_CHUNK_SIZE = 1 << 20
DEFAULT_RETRY_SECONDS = 60.0  # how long a store keeps retrying a transient error
DEFAULT_ORPHAN_AGE = 3600.0  # an unfinished upload untouched this long belongs to a dead writer


@runtime_checkable
class Readable(Protocol):
    """Anything to copy from by ``read(size)``: an open file, a blob reader."""

    def read(self, size: int, /) -> bytes: ...


_KEY_SEGMENT = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-=+@]*")


class StoreError(Exception):
    """A blob-store operation failed."""


class InvalidBlobKeyError(StoreError, ValueError):
    """A key is not a safe relative name (empty segment, ``..``, hidden name...)."""


class BlobNotFoundError(StoreError, LookupError):
    """No object is stored under the key."""


class StoreUnavailableError(StoreError):
    """The store could not be reached, or kept failing after retries."""


class StoreConfigError(StoreError):
    """A store URI or its settings are invalid or incomplete."""


class StoreNotFound(StoreConfigError):
    """The bucket or container the store names does not exist (permanent)."""


class StorePermissionError(StoreError):
    """The store refused the credentials or the action: access denied, invalid key (permanent)."""


class StoreFull(StoreError):
    """The store has no space left; the message names the store and the path."""


def validate_key(key: str) -> str:
    """Return ``key`` if every ``/``-separated segment is a plain, visible name.

    Segments start with a letter, digit, ``_`` or ``-`` (so ``.``, ``..`` and
    hidden names, which stores reserve for their own use, are refused).
    """
    segments = key.split("/")
    if not key or any(_KEY_SEGMENT.fullmatch(segment) is None for segment in segments):
        raise InvalidBlobKeyError(f"invalid blob key {key!r}")
    return key


def validate_prefix(prefix: str) -> str:
    """Return a listing prefix: empty, or a key optionally ending with ``/``."""
    if prefix:
        validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def store_prefix(prefix: str) -> str:
    """Normalise the prefix part of a store URI to ``""`` or ``"a/b/"``."""
    stripped = prefix.strip("/")
    try:
        return validate_key(stripped) + "/" if stripped else ""
    except InvalidBlobKeyError:
        raise StoreConfigError(f"invalid store prefix {prefix!r}") from None


class BlobReader(ABC):
    """A readable stream over one stored object; close it when done."""

    @abstractmethod
    def read(self, size: int = -1) -> bytes:
        """Return up to ``size`` bytes (all remaining when negative); ``b""`` at the end."""

    def close(self) -> None:  # noqa: B027 (an optional hook: nothing to release by default)
        """Release the underlying connection or file."""

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ChunkReader(BlobReader):
    """A :class:`BlobReader` over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes], on_close: Callable[[], None] | None = None) -> None:
        self._chunks = chunks
        self._current = b""
        self._offset = 0
        self._on_close = on_close

    def read(self, size: int = -1) -> bytes:
        parts = []
        remaining = size
        while remaining != 0:
            if self._offset == len(self._current):
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._current, self._offset = chunk, 0
            end = len(self._current) if remaining < 0 else self._offset + remaining
            part = self._current[self._offset : end]
            self._offset += len(part)
            remaining -= len(part) if remaining > 0 else 0
            parts.append(part)
        return b"".join(parts)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


class BlobUpload(ABC):
    """One in-progress upload: ``write`` parts, then ``commit`` or ``abort``."""

    @abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; return its length."""

    def flush(self) -> None:  # noqa: B027 (a no-op for every store, there for file-object callers)
        """For file-object callers (``torch.save``): data is sent as parts fill and on commit."""

    @abstractmethod
    def commit(self) -> None:
        """Make the object visible under its key, replacing any previous one."""

    @abstractmethod
    def abort(self) -> None:
        """Discard everything written; the key keeps its previous object, if any."""


class BlobStore(ABC):
    """A flat namespace of immutable objects with atomic, streaming writes."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """The store's location as a ``file://``, ``s3://`` or ``az://`` URI."""

    @abstractmethod
    def _start_upload(self, key: str) -> BlobUpload:
        """Begin an upload to a validated key."""

    @abstractmethod
    def get(self, key: str) -> BlobReader:
        """Open the object under ``key`` for streaming reads (:class:`BlobNotFoundError` if absent)."""

    @abstractmethod
    def sizes(self, prefix: str = "") -> dict[str, int]:
        """The byte size of every committed object whose key starts with ``prefix``, by key (one listing)."""

    def list(self, prefix: str = "") -> list[str]:
        """Return the sorted keys of committed objects that start with ``prefix``."""
        return sorted(self.sizes(prefix))

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object under ``key``; a missing object is not an error."""

    def sweep(self, older_than: float = DEFAULT_ORPHAN_AGE) -> int:
        """Remove uploads that were started more than ``older_than`` seconds ago and never finished.

        Returns how many were removed. A store with nothing to reclaim (Azure
        Blob discards uncommitted blocks itself) keeps this default.
        """
        return 0

    @contextmanager
    def writer(self, key: str) -> Iterator[BlobUpload]:
        """Stream an object: commit on normal exit, abort if the block or the commit raises."""
        upload = self._start_upload(validate_key(key))
        try:
            yield upload
            upload.commit()  # a part sent in the background may fail only here
        except BaseException:
            upload.abort()
            raise

    def put(self, key: str, source: bytes | bytearray | memoryview | Readable | Iterable[bytes]) -> int:
        """Atomically store everything read from ``source``; return the byte count."""
        total = 0
        with self.writer(key) as upload:
            for chunk in _chunks_of(source):
                total += upload.write(chunk)
        return total

    def get_bytes(self, key: str) -> bytes:
        """Return a whole (small) object."""
        with self.get(key) as reader:
            return reader.read()

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of the object under ``key`` from ``offset`` on (fewer past its end).

        This default streams the object from its start; the stores read only the range.
        """
        with self.get(key) as reader:
            while offset > 0:
                skipped = len(reader.read(min(offset, 1 << 24)))
                if not skipped:
                    return b""
                offset -= skipped
            return reader.read(length)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def _chunks_of(
    source: bytes | bytearray | memoryview | Readable | Iterable[bytes],
) -> Iterator[bytes | bytearray | memoryview]:
    if isinstance(source, bytes | bytearray | memoryview):
        yield source
    elif isinstance(source, Readable):
        while chunk := source.read(COPY_CHUNK_SIZE):
            yield chunk
    else:
        yield from source
