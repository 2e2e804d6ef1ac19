"""A payload tensor as streams of checksummed chunks, and back, without extra copies.

A payload may travel as several stripes (contiguous byte ranges), each its
own stream of chunks, so several connections can carry it at once. Each
chunk carries the XXH3-64 hash of its data: TLS already authenticates every
byte, the hash catches our own bugs (a wrong slice, a stale or truncated
buffer) at tens of GB/s, where CRC-32 was the transport's largest CPU cost.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from xxhash import xxh3_64_intdigest

from .bandwidth import TokenBucket
from .wire import Chunk

DEFAULT_CHUNK_BYTES = 1 << 20
MAX_STRIPES = 64

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class CorruptPayload(ValueError):
    """Chunks that are out of order, inconsistent, truncated or fail their checksum."""


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"gossip payloads cannot carry {dtype}")
    return _DTYPE_NAMES[dtype]


def stripe_bounds(total: int, stripe: int, stripes: int) -> tuple[int, int]:
    """The byte range ``[start, end)`` of ``stripe`` out of ``stripes``."""
    return stripe * total // stripes, (stripe + 1) * total // stripes


def to_chunks(
    round: int,
    sender: int,
    payload: torch.Tensor,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    bucket: TokenBucket | None = None,
    stripe: int = 0,
    stripes: int = 1,
) -> Iterator[Chunk]:
    """Yield one stripe of ``payload`` (contiguous, 1-D, CPU, kept alive by the caller)
    as chunks that are views of its memory, paced by ``bucket``."""
    name = dtype_name(payload.dtype)
    raw = payload.view(torch.uint8).numpy().data if payload.numel() else memoryview(b"")
    start, end = stripe_bounds(len(raw), stripe, stripes)
    count = max(1, -(-(end - start) // chunk_bytes))
    for index in range(count):
        data = raw[start + index * chunk_bytes : min(end, start + (index + 1) * chunk_bytes)]
        if bucket is not None:
            bucket.take(len(data))
        yield Chunk(round, sender, index, count, len(raw), name, xxh3_64_intdigest(data), data, stripe, stripes)


@dataclass
class _StripeCursor:
    count: int
    next: int
    filled: int  # absolute position of the next byte
    end: int


class Assembly:
    """Collects one payload from one sender into ``buffer``.

    Each stripe must arrive in order; different stripes may be fed from
    different threads at once. Workers of a job swap payloads of the same
    size, so a payload of any other size than the buffer's is refused.
    """

    def __init__(self, round: int, sender: int, buffer: bytearray):
        self.round = round
        self.sender = sender
        self.buffer = buffer
        self._lock = threading.Lock()
        self._view = memoryview(buffer)
        self._header: tuple[int, str, int] | None = None  # total bytes, dtype, stripes
        self._cursors: dict[int, _StripeCursor] = {}

    def _cursor(self, chunk: Chunk) -> _StripeCursor:
        with self._lock:
            header = (chunk.total_bytes, chunk.dtype, chunk.stripes)
            if self._header is None:
                if chunk.total_bytes != len(self.buffer):
                    raise CorruptPayload(f"payload of {chunk.total_bytes} bytes, expected {len(self.buffer)}")
                if chunk.dtype not in DTYPES or not 1 <= chunk.stripes <= MAX_STRIPES:
                    raise CorruptPayload(f"bad payload header: dtype {chunk.dtype!r}, {chunk.stripes} stripes")
                self._header = header
            elif header != self._header:
                raise CorruptPayload("payload header differs between chunks")
            if not 0 <= chunk.stripe < chunk.stripes:
                raise CorruptPayload(f"stripe {chunk.stripe} of {chunk.stripes}")
            if chunk.stripe not in self._cursors:
                if chunk.index != 0 or chunk.count < 1:
                    raise CorruptPayload(f"stripe {chunk.stripe} starts at chunk {chunk.index} of {chunk.count}")
                start, end = stripe_bounds(chunk.total_bytes, chunk.stripe, chunk.stripes)
                self._cursors[chunk.stripe] = _StripeCursor(chunk.count, 0, start, end)
            return self._cursors[chunk.stripe]

    def add(self, chunk: Chunk) -> None:
        if chunk.round != self.round or chunk.sender != self.sender:
            raise CorruptPayload(
                f"chunk of round {chunk.round} from worker {chunk.sender}, "
                f"expected round {self.round} from worker {self.sender}"
            )
        cursor = self._cursor(chunk)
        if chunk.count != cursor.count or chunk.index != cursor.next:
            raise CorruptPayload(f"chunk {chunk.index}/{chunk.count} arrived, expected {cursor.next}/{cursor.count}")
        if xxh3_64_intdigest(chunk.data) != chunk.checksum:
            raise CorruptPayload(f"chunk {chunk.index} of stripe {chunk.stripe} fails its checksum")
        end = cursor.filled + len(chunk.data)
        if end > cursor.end:
            raise CorruptPayload(f"chunks overrun stripe {chunk.stripe}")
        self._view[cursor.filled : end] = chunk.data
        cursor.filled = end
        cursor.next += 1

    @property
    def complete(self) -> bool:
        with self._lock:
            return (
                self._header is not None
                and len(self._cursors) == self._header[2]
                and all(c.next == c.count and c.filled == c.end for c in self._cursors.values())
            )

    def tensor(self) -> torch.Tensor:
        """The payload; raises ``CorruptPayload`` if chunks are missing."""
        header = self._header
        if header is None or not self.complete:
            raise CorruptPayload("payload incomplete")
        if not self.buffer:
            return torch.empty(0, dtype=DTYPES[header[1]])
        return torch.frombuffer(self.buffer, dtype=DTYPES[header[1]])
