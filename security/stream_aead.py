"""Versioned streaming AEAD: AES-256-GCM segments under an HKDF-derived, committed key.

Layout of a sealed object (integers big-endian)::

    magic "CNTS" | version u8 | algorithm u8
    | envelope_len u16 | key envelope           (wrapped data key; replaceable)
    | context_len u16 | context                (tenant, job, step, object name)
    | segment_size u32 | salt[32] | nonce_prefix[7]
    | commitment[32]
    | segment 0 | segment 1 | ... | final segment      (each: ciphertext || 16-byte tag)

Every object gets a fresh 256-bit data key, wrapped by a key-encryption key
into the *key envelope* (see :mod:`cantata.security.keys`). From the data key,
HKDF-SHA256 (salt = the header's salt, info = the header's *binding*: every
field above except the envelope and the commitment) derives 64 bytes: the
segment key and a key commitment stored in the header. So the version,
algorithm, context and segment parameters are all authenticated, and a data
key other than the writer's cannot pass (key commitment, as in the AWS
Encryption SDK). Segment ``i`` is sealed with nonce ``prefix || u32(i) ||
last-flag`` (as in Tink's AES-GCM-HKDF streaming AEAD): reordering, dropping
or appending segments, or truncating at a segment boundary, is detected, and a
stream refuses to grow past 2**32 segments rather than reuse a nonce.

Headers are checked in the order they are read, so a downgraded or unknown
version is refused before any key is touched. The envelope is the only field
outside the binding: re-wrapping a data key under a new key-encryption key
replaces it without decrypting (or changing) anything else.

The *sealed digest* of an object is SHA-256 over its header without the
envelope and over every segment's tag. Each tag authenticates its segment's
ciphertext under the object's own key, so for anyone without that key the
digest pins every byte of the ciphertext, at the cost of hashing 16 bytes per
segment rather than the whole body. It survives re-wrapping, and it is what
checkpoint manifests record.

Memory stays bounded: a writer holds one segment, a reader two (it reads one
ahead to know which segment is the final one).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import struct
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol, overload

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC = b"CNTS"
FORMAT_VERSION = 1
MIN_FORMAT_VERSION = 1
ALGORITHM_AES256_GCM_HKDF_SHA256 = 1
DEFAULT_SEGMENT_SIZE = 1 << 20
MIN_SEGMENT_SIZE = 1 << 10
MAX_SEGMENT_SIZE = 64 << 20
MAX_SEGMENTS = 1 << 32
DATA_KEY_SIZE = 32
SALT_SIZE = 32
NONCE_PREFIX_SIZE = 7
COMMITMENT_SIZE = 32
TAG_SIZE = 16
DECRYPT_THREADS = 2  # segments decrypted at once by read_into
_HKDF_INFO_LABEL = b"cantata/stream-aead/v1\x00"
_CANONICAL_STEP = re.compile(rb"0|[1-9][0-9]{0,19}")  # ASCII, no sign, no leading zero, no separator


class IntegrityError(Exception):
    """Sealed data was refused: it is malformed, tampered with, misplaced or keyed wrongly."""


class MalformedHeaderError(IntegrityError):
    """The object does not start with a well-formed header."""


class UnsupportedFormatError(IntegrityError):
    """The header names a format version or algorithm newer than this reader knows."""


class FormatDowngradeError(IntegrityError):
    """The header names a format version older than the oldest one accepted."""


class ContextMismatchError(IntegrityError):
    """The object was sealed for another tenant, job, step or object name."""


class HeaderAuthenticationError(IntegrityError):
    """The header's fields do not match its key commitment (modified header)."""


class SegmentAuthenticationError(IntegrityError):
    """A segment failed authentication: modified, reordered or from another stream."""


class TruncatedStreamError(IntegrityError):
    """The object ends before its final segment."""


class TrailingDataError(IntegrityError):
    """Bytes follow the final segment."""


class BufferTooSmallError(ValueError):
    """The plaintext does not fit the buffer given to :meth:`StreamDecryptor.read_into`."""


class SegmentLimitError(OverflowError):
    """The stream would need more than 2**32 segments (the nonce counter would wrap)."""


class Sink(Protocol):
    """Where a sealed stream goes: a file, a blob upload."""

    def write(self, data: bytes, /) -> object: ...


class Source(Protocol):
    """Where a sealed stream comes from: a file, a blob reader, views of bytes already fetched."""

    def read(self, size: int, /) -> bytes | memoryview: ...


class KeyWrapper(Protocol):
    """Wraps a fresh data key under a key-encryption key into an opaque envelope."""

    def wrap(self, data_key: bytes) -> bytes: ...


class KeyUnwrapper(Protocol):
    """Recovers the data key from an envelope (raising an :class:`IntegrityError` on failure)."""

    def unwrap(self, envelope: bytes) -> bytes: ...


@dataclass(frozen=True)
class StreamContext:
    """What an object is: bound into its key derivation and checked on read."""

    tenant: str
    job_id: str
    step: int
    object_name: str

    def encode(self) -> bytes:
        fields = [self.tenant, self.job_id, str(self.step), self.object_name]
        return b"".join(_length_prefixed(field.encode()) for field in fields)

    @classmethod
    def decode(cls, data: bytes) -> StreamContext:
        fields = []
        offset = 0
        for _ in range(4):
            if offset + 2 > len(data):
                raise MalformedHeaderError("context field is cut short")
            (length,) = struct.unpack_from(">H", data, offset)
            fields.append(data[offset + 2 : offset + 2 + length])
            offset += 2 + length
        if offset != len(data) or len(fields[3]) == 0:
            raise MalformedHeaderError("context has the wrong length")
        try:
            tenant, job_id, name = (field.decode() for field in (fields[0], fields[1], fields[3]))
        except UnicodeDecodeError as error:
            raise MalformedHeaderError(f"context is not valid: {error}") from None
        if _CANONICAL_STEP.fullmatch(fields[2]) is None:
            raise MalformedHeaderError(f"context step {bytes(fields[2])!r} is not a canonical decimal")
        context = cls(tenant, job_id, int(fields[2]), name)
        if context.encode() != data:  # the binding is re-encoded from the fields: only one spelling may pass
            raise MalformedHeaderError("context is not in its canonical form")
        return context

    def __str__(self) -> str:
        return f"tenant={self.tenant} job={self.job_id} step={self.step} object={self.object_name}"


@dataclass(frozen=True)
class StreamHeader:
    """The parsed header of a sealed object."""

    version: int
    algorithm: int
    key_envelope: bytes
    context: StreamContext
    segment_size: int
    salt: bytes
    nonce_prefix: bytes
    commitment: bytes

    @property
    def binding(self) -> bytes:
        """Every header byte the segment key is derived from (all but envelope and commitment)."""
        context = self.context.encode()
        return (
            MAGIC
            + struct.pack(">BB", self.version, self.algorithm)
            + _length_prefixed(context)
            + struct.pack(">I", self.segment_size)
            + self.salt
            + self.nonce_prefix
        )

    def encode(self) -> bytes:
        prologue = MAGIC + struct.pack(">BB", self.version, self.algorithm)
        return prologue + _length_prefixed(self.key_envelope) + self.binding[len(prologue) :] + self.commitment

    @property
    def digested_bytes(self) -> bytes:
        """The header's contribution to the sealed digest (everything but the envelope)."""
        return self.binding + self.commitment

    def with_envelope(self, key_envelope: bytes) -> StreamHeader:
        return replace(self, key_envelope=key_envelope)

    @classmethod
    def read(cls, source: Source) -> StreamHeader:
        """Parse a header from ``source``, refusing bad magic or versions before reading on."""
        prologue = _read_header_field(source, len(MAGIC) + 2)
        if prologue[: len(MAGIC)] != MAGIC:
            raise MalformedHeaderError("not a Cantata sealed object (bad magic)")
        version, algorithm = struct.unpack_from(">BB", prologue, len(MAGIC))
        if version < MIN_FORMAT_VERSION:
            raise FormatDowngradeError(f"format version {version} is older than the minimum {MIN_FORMAT_VERSION}")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatError(f"format version {version} is newer than {FORMAT_VERSION}")
        if algorithm != ALGORITHM_AES256_GCM_HKDF_SHA256:
            raise UnsupportedFormatError(f"unknown algorithm {algorithm}")
        envelope = _read_header_field(source, struct.unpack(">H", _read_header_field(source, 2))[0])
        context = StreamContext.decode(
            _read_header_field(source, struct.unpack(">H", _read_header_field(source, 2))[0])
        )
        (segment_size,) = struct.unpack(">I", _read_header_field(source, 4))
        if not MIN_SEGMENT_SIZE <= segment_size <= MAX_SEGMENT_SIZE:
            raise MalformedHeaderError(f"segment size {segment_size} is out of range")
        salt = _read_header_field(source, SALT_SIZE)
        nonce_prefix = _read_header_field(source, NONCE_PREFIX_SIZE)
        commitment = _read_header_field(source, COMMITMENT_SIZE)
        return cls(version, algorithm, envelope, context, segment_size, salt, nonce_prefix, commitment)


@dataclass(frozen=True)
class SealedSummary:
    """Sizes and digest of one sealed object, as written or as verified.

    ``sealed_size`` counts the object's bytes except its key envelope.
    """

    plaintext_size: int
    sealed_size: int
    sealed_digest: str
    segments: int


def segment_nonce(prefix: bytes, index: int, last: bool) -> bytes:
    """The 96-bit nonce of segment ``index``: prefix || u32 index || last flag."""
    if not 0 <= index < MAX_SEGMENTS:
        raise SegmentLimitError(f"segment index {index} does not fit the 32-bit counter")
    return prefix + struct.pack(">IB", index, 1 if last else 0)


def _derive(data_key: bytes, header: StreamHeader) -> tuple[AESGCM, bytes]:
    """The segment cipher and the key commitment for ``header``."""
    derived = HKDF(
        algorithm=hashes.SHA256(), length=64, salt=header.salt, info=_HKDF_INFO_LABEL + header.binding
    ).derive(data_key)
    return AESGCM(derived[:32]), derived[32:]


def _segment_cipher(header: StreamHeader, data_key: bytes) -> AESGCM:
    """The segment cipher, once ``data_key`` is shown to match the header's commitment."""
    cipher, commitment = _derive(data_key, header)
    if not hmac.compare_digest(commitment, header.commitment):
        raise HeaderAuthenticationError(f"header of {header.context} does not match its key commitment")
    return cipher


def rewrap_header(header: StreamHeader, unwrapper: KeyUnwrapper, wrapper: KeyWrapper) -> StreamHeader:
    """``header`` with its data key re-wrapped by ``wrapper``; segments stay valid as they are."""
    data_key = unwrapper.unwrap(header.key_envelope)
    _segment_cipher(header, data_key)
    return header.with_envelope(wrapper.wrap(data_key))


class StreamEncryptor:
    """A writable stream that seals what is written to it into ``sink``.

    ``close()`` seals the final segment and returns the :class:`SealedSummary`.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        context: StreamContext,
        wrapper: KeyWrapper,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
    ) -> None:
        if not MIN_SEGMENT_SIZE <= segment_size <= MAX_SEGMENT_SIZE:
            raise ValueError(f"segment_size must be within [{MIN_SEGMENT_SIZE}, {MAX_SEGMENT_SIZE}]")
        data_key = os.urandom(DATA_KEY_SIZE)
        unkeyed = StreamHeader(
            version=FORMAT_VERSION,
            algorithm=ALGORITHM_AES256_GCM_HKDF_SHA256,
            key_envelope=wrapper.wrap(data_key),
            context=context,
            segment_size=segment_size,
            salt=os.urandom(SALT_SIZE),
            nonce_prefix=os.urandom(NONCE_PREFIX_SIZE),
            commitment=b"",
        )
        self._cipher, commitment = _derive(data_key, unkeyed)
        self.header = replace(unkeyed, commitment=commitment)
        self._sink = sink
        self._buffer = bytearray()
        self._index = 0
        self._plaintext_size = 0
        self._digest = hashlib.sha256(self.header.digested_bytes)
        self._sealed_size = len(self.header.digested_bytes)
        self._summary: SealedSummary | None = None
        sink.write(self.header.encode())

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._summary is not None:
            raise ValueError("write to a closed StreamEncryptor")
        view = memoryview(data).cast("B")
        size = view.nbytes
        segment_size = self.header.segment_size
        while view:
            if len(self._buffer) == segment_size:
                self._seal(self._buffer, last=False)
                self._buffer.clear()
            if not self._buffer and len(view) > segment_size:
                self._seal(view[:segment_size], last=False)
                view = view[segment_size:]
                continue
            take = min(segment_size - len(self._buffer), len(view))
            self._buffer += view[:take]
            view = view[take:]
        self._plaintext_size += size
        return size

    def flush(self) -> None:
        """Segments are written as they fill; nothing is held beyond the current one."""

    def close(self) -> SealedSummary:
        if self._summary is None:
            self._seal(self._buffer, last=True)
            self._buffer.clear()
            self._summary = SealedSummary(
                self._plaintext_size, self._sealed_size, self._digest.hexdigest(), self._index
            )
        return self._summary

    def _seal(self, plaintext: bytearray | memoryview, *, last: bool) -> None:
        nonce = segment_nonce(self.header.nonce_prefix, self._index, last)
        sealed = self._cipher.encrypt(nonce, plaintext, None)
        self._sink.write(sealed)
        self._digest.update(sealed[-TAG_SIZE:])
        self._sealed_size += len(sealed)
        self._index += 1


class StreamDecryptor:
    """Opens a sealed object: the header is verified on construction, segments on iteration.

    Iterating yields authenticated plaintext, one segment at a time; after the
    final segment :attr:`summary` holds the verified sizes and sealed digest.
    With ``expected_sealed_size`` (e.g. from a manifest), a short object is
    reported as truncated even when it ends inside a segment.
    """

    def __init__(
        self,
        source: Source,
        *,
        context: StreamContext,
        unwrapper: KeyUnwrapper,
        expected_sealed_size: int | None = None,
    ) -> None:
        self.header = StreamHeader.read(source)
        if self.header.context != context:
            raise ContextMismatchError(f"object is sealed for {self.header.context}, expected {context}")
        self._cipher = _segment_cipher(self.header, unwrapper.unwrap(self.header.key_envelope))
        self._source = source
        self._expected_sealed_size = expected_sealed_size
        self.summary: SealedSummary | None = None

    def __iter__(self) -> Iterator[bytes]:
        for index, sealed, last in self._segments():
            yield self._open_segment(index, sealed, last)

    def read_into(self, buffer: bytearray | memoryview) -> int:
        """Decrypt the whole plaintext straight into ``buffer`` and return its size.

        ``buffer`` must be writable and hold at least the plaintext (else :class:`BufferTooSmallError`).
        Each segment is decrypted into its place and authenticated there, on up to
        ``DECRYPT_THREADS`` threads (the AEAD releases the GIL) while the next is read;
        if any fails, the first failure propagates and what ``buffer`` holds must not be used.
        """
        view = memoryview(buffer).cast("B")
        size = 0
        in_flight: deque[Future[memoryview]] = deque()
        with ThreadPoolExecutor(DECRYPT_THREADS, thread_name_prefix="decrypt") as pool:
            for index, sealed, last in self._segments():
                end = size + max(0, len(sealed) - TAG_SIZE)
                if end > len(view):
                    raise BufferTooSmallError(
                        f"{self.header.context}: plaintext does not fit a buffer of {len(view)} bytes"
                    )
                in_flight.append(pool.submit(self._open_segment, index, sealed, last, view[size:end]))
                size = end
                if len(in_flight) > DECRYPT_THREADS:
                    in_flight.popleft().result()
            while in_flight:
                in_flight.popleft().result()
        return size

    def _segments(self) -> Iterator[tuple[int, bytes | memoryview, bool]]:
        """Each sealed segment (never reused once yielded), its index and whether it is the final one."""
        header = self.header
        sealed_segment = header.segment_size + TAG_SIZE
        digest = hashlib.sha256(header.digested_bytes)
        sealed_size = len(header.digested_bytes)
        plaintext_size = 0
        index = 0
        chunk = _read_exact(self._source, sealed_segment)
        while True:
            following = _read_exact(self._source, sealed_segment) if len(chunk) == sealed_segment else b""
            last = not following
            if (
                last
                and self._expected_sealed_size is not None
                and sealed_size + len(chunk) < self._expected_sealed_size
            ):
                raise TruncatedStreamError(
                    f"{header.context}: object ends at {sealed_size + len(chunk)} of {self._expected_sealed_size} bytes"
                )
            yield index, chunk, last
            digest.update(chunk[-TAG_SIZE:])
            sealed_size += len(chunk)
            plaintext_size += len(chunk) - TAG_SIZE
            if last:
                break
            chunk = following
            index += 1
        self.summary = SealedSummary(plaintext_size, sealed_size, digest.hexdigest(), index + 1)

    @overload
    def _open_segment(self, index: int, sealed: bytes | memoryview, last: bool) -> bytes: ...
    @overload
    def _open_segment(self, index: int, sealed: bytes | memoryview, last: bool, into: memoryview) -> memoryview: ...
    def _open_segment(
        self, index: int, sealed: bytes | memoryview, last: bool, into: memoryview | None = None
    ) -> bytes | memoryview:
        """The authenticated plaintext of a segment (written into ``into`` when given)."""
        if len(sealed) < TAG_SIZE:
            raise TruncatedStreamError(f"{self.header.context}: segment {index} is cut short")
        plaintext = self._try_open(index, sealed, last, into)
        if plaintext is not None:
            return plaintext
        if self._try_open(index, sealed, not last, into) is None:
            raise SegmentAuthenticationError(
                f"{self.header.context}: segment {index} failed authentication (modified, reordered or foreign)"
            )
        if last:
            raise TruncatedStreamError(f"{self.header.context}: stream ends after non-final segment {index}")
        raise TrailingDataError(f"{self.header.context}: data follows the final segment {index}")

    def _try_open(
        self, index: int, sealed: bytes | memoryview, last: bool, into: memoryview | None
    ) -> bytes | memoryview | None:
        nonce = segment_nonce(self.header.nonce_prefix, index, last)
        try:
            if into is None:
                return self._cipher.decrypt(nonce, sealed, None)
            self._cipher.decrypt_into(nonce, sealed, None, into)
            return into
        except InvalidTag:
            return None

    def read_all(self) -> bytes:
        """Decrypt and return the whole plaintext (for small objects such as manifests)."""
        return b"".join(self)


def _length_prefixed(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("header field longer than 65535 bytes")
    return struct.pack(">H", len(data)) + data


def _read_exact(source: Source, size: int) -> bytes | memoryview:
    """``size`` bytes (fewer at the end); a whole part the source returned is passed on as it is, uncopied."""
    part = source.read(size)
    if not part or len(part) == size:
        return part
    parts = [part]
    remaining = size - len(part)
    while remaining:
        part = source.read(remaining)
        if not part:
            break
        parts.append(part)
        remaining -= len(part)
    return b"".join(parts)


def _read_header_field(source: Source, size: int) -> bytes:
    data = bytes(_read_exact(source, size))
    if len(data) != size:
        raise TruncatedStreamError("object ends inside its header")
    return data
