"""Pre-tokenized shards: a small binary format for token arrays.

Layout (integers little-endian, so the body maps straight onto a NumPy array)::

    offset  size  field
    0       4     magic b"CNTK"
    4       1     format version (1)
    5       1     token width in bytes: 2 (uint16) or 4 (uint32)
    6       2     reserved, zero
    8       8     token count
    16      4     CRC-32 of the token bytes
    20      4     CRC-32 of bytes 0..20 (the header itself)
    24      ...   count tokens of the given width

Version 2 (a shard made with a tokenizer, ``cantata data prepare --tokenizer``)
records it between the token checksum and the header's own::

    20      4     the tokenizer's vocabulary size
    24      32    SHA-256 of its tokenizer.json
    56      4     CRC-32 of bytes 0..56 (the header itself)
    60      ...   count tokens of the given width

A shard's size is exactly its header's size plus ``count * width``: a shorter object is
truncated, a longer one has trailing bytes, and both are refused, as are a
bad magic, an unknown version or width, a header that fails its own checksum
and tokens that fail theirs. Errors name the object.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from zlib_ng.zlib_ng import crc32  # zlib's CRC-32, 5x faster (carry-less multiply)

from cantata.trainer.data.errors import ShardChecksumError, ShardHeaderError, ShardTruncatedError

MAGIC = b"CNTK"
FORMAT_VERSION = 1  # byte-level tokens, no tokenizer recorded
TOKENIZER_VERSION = 2  # the tokenizer recorded in the header
SHARD_SUFFIX = ".tok"
HEADER = struct.Struct("<4sBBHQII")
HEADER_SIZE = HEADER.size
TOKENIZER_HEADER = struct.Struct("<4sBBHQII32sI")
DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_BY_WIDTH = {dtype.itemsize: dtype for dtype in DTYPES.values()}
MIN_TOKEN_WIDTH = min(_BY_WIDTH)  # bytes a token takes in the narrowest shard


@dataclass(frozen=True)
class TokenizerRecord:
    """Which tokenizer made a shard's tokens: its vocabulary size and the SHA-256 of its tokenizer.json."""

    vocab_size: int
    digest: bytes

    @property
    def name(self) -> str:
        """How a job names it (the ``tokenizer`` field)."""
        return f"sha256:{self.digest.hex()}"


@dataclass(frozen=True)
class ShardHeader:
    """The parsed header of a shard."""

    dtype: np.dtype
    count: int
    tokens_crc: int
    tokenizer: TokenizerRecord | None = None  # None: byte-level tokens (format version 1)

    @property
    def body_size(self) -> int:
        return self.count * self.dtype.itemsize

    @property
    def size(self) -> int:
        return HEADER_SIZE if self.tokenizer is None else TOKENIZER_HEADER.size

    def encode(self) -> bytes:
        fields = (MAGIC, FORMAT_VERSION, self.dtype.itemsize, 0, self.count, self.tokens_crc)
        if self.tokenizer is None:
            head = HEADER.pack(*fields, 0)
        else:
            fields = (MAGIC, TOKENIZER_VERSION, *fields[2:])
            head = TOKENIZER_HEADER.pack(*fields, self.tokenizer.vocab_size, self.tokenizer.digest, 0)
        return head[:-4] + struct.pack("<I", crc32(head[:-4]))

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, name: str) -> ShardHeader:
        if len(data) < HEADER_SIZE:
            raise ShardTruncatedError(f"shard {name}: {len(data)} bytes, shorter than its {HEADER_SIZE}-byte header")
        magic, version, width, reserved, count, tokens_crc, header_crc = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ShardHeaderError(f"shard {name}: bad magic {bytes(magic)!r}, not a Cantata token shard")
        if version not in (FORMAT_VERSION, TOKENIZER_VERSION):
            raise ShardHeaderError(f"shard {name}: unsupported format version {version}")
        tokenizer = None
        size = HEADER_SIZE
        if version == TOKENIZER_VERSION:
            size = TOKENIZER_HEADER.size
            if len(data) < size:
                raise ShardTruncatedError(f"shard {name}: {len(data)} bytes, shorter than its {size}-byte header")
            *_, vocab_size, digest, header_crc = TOKENIZER_HEADER.unpack_from(data)
            tokenizer = TokenizerRecord(vocab_size, bytes(digest))
        if width not in _BY_WIDTH or reserved != 0:
            raise ShardHeaderError(f"shard {name}: unknown token width {width} or non-zero reserved field")
        if crc32(data[: size - 4]) != header_crc:
            raise ShardHeaderError(f"shard {name}: header checksum mismatch")
        return cls(_BY_WIDTH[width], count, tokens_crc, tokenizer)


def dtype_for(name: str) -> np.dtype:
    """The token dtype called ``name`` (``uint16`` or ``uint32``)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown token dtype {name!r} (use {' or '.join(DTYPES)})") from None


def encode_shard(tokens: np.ndarray, dtype: np.dtype, tokenizer: TokenizerRecord | None = None) -> bytes:
    """The shard holding ``tokens`` stored as ``dtype``, made by ``tokenizer`` (None: bytes); tokens must fit it."""
    if tokens.size and int(tokens.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token {int(tokens.max())} does not fit {dtype.name}")
    body = np.ascontiguousarray(tokens, dtype=dtype).tobytes()
    return ShardHeader(dtype, tokens.size, crc32(body), tokenizer).encode() + body


def decode_shard(data: bytes | bytearray, name: str) -> np.ndarray:
    """Verify a whole shard and return its tokens (a read-only view of ``data``)."""
    return open_shard(data, name)[1]


def open_shard(data: bytes | bytearray, name: str) -> tuple[ShardHeader, np.ndarray]:
    """Verify a whole shard and return its header and tokens (a read-only view of ``data``)."""
    header = ShardHeader.decode(data, name)
    expected = header.size + header.body_size
    if len(data) < expected:
        raise ShardTruncatedError(f"shard {name}: {len(data)} bytes, its header promises {expected}")
    if len(data) > expected:
        raise ShardTruncatedError(f"shard {name}: {len(data) - expected} bytes follow its {header.count} tokens")
    body = memoryview(data)[header.size :]
    if crc32(body) != header.tokens_crc:
        raise ShardChecksumError(f"shard {name}: token checksum mismatch (corrupted data)")
    return header, np.frombuffer(body, dtype=header.dtype)
