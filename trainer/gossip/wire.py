"""``GossipChunk`` wire encoding with the fewest copies of the payload bytes.

The generated protobuf class would copy every chunk's data three times on the
way out and twice on the way in. These functions write and read the same
protobuf wire format (``proto/cantata/v1/gossip.proto``) directly: the data
field is copied once from a memoryview of the tensor into the message bytes
that gRPC sends, and parsed back as a memoryview of the received message.
Unknown fields are skipped, as protobuf requires.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cantata.proto.v1 import gossip_pb2

METHOD = "/cantata.v1.Gossip/Exchange"
COMMIT = "/cantata.v1.Gossip/Commit"
REDUCE = "/cantata.v1.Gossip/Reduce"
_DATA_TAG = bytes([8 << 3 | 2])  # field 8, length-delimited
_VARINT_FIELDS = {
    1: "round",
    2: "sender",
    3: "index",
    4: "count",
    5: "total_bytes",
    9: "stripe",
    10: "stripes",
    12: "step",
}


class MalformedChunk(ValueError):
    """Bytes that are not a well-formed ``GossipChunk``."""


@dataclass
class Chunk:
    round: int
    sender: int
    index: int
    count: int
    total_bytes: int
    dtype: str
    checksum: int
    data: memoryview | bytes
    stripe: int = 0
    stripes: int = 1
    step: int = 0


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode(chunk: Chunk) -> bytes:
    header = gossip_pb2.GossipChunk(
        round=chunk.round,
        sender=chunk.sender,
        index=chunk.index,
        count=chunk.count,
        total_bytes=chunk.total_bytes,
        dtype=chunk.dtype,
        checksum=chunk.checksum,
        stripe=chunk.stripe,
        stripes=chunk.stripes,
        step=chunk.step,
    ).SerializeToString()
    return b"".join((header, _DATA_TAG, _varint(len(chunk.data)), chunk.data))


class WireCounter:
    """Adds up the bytes of every message a node serializes for sending: its traffic as gRPC messages.

    (TLS records and HTTP/2 frames add a few tens of bytes per message on top.)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0

    @property
    def total(self) -> int:
        with self._lock:
            return self._bytes

    def encode(self, chunk: Chunk) -> bytes:
        return self._count(encode(chunk))

    def serializer(self, serialize: Callable[..., bytes]) -> Callable[..., bytes]:
        return lambda message: self._count(serialize(message))

    def _count(self, raw: bytes) -> bytes:
        with self._lock:
            self._bytes += len(raw)
        return raw


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise MalformedChunk("truncated or overlong varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def decode(raw: bytes) -> Chunk:
    view = memoryview(raw)
    numbers = dict.fromkeys(
        ("round", "sender", "index", "count", "total_bytes", "checksum", "stripe", "stripes", "step"), 0
    )
    dtype, data = "", memoryview(b"")
    pos = 0
    while pos < len(view):
        key, pos = _read_varint(view, pos)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, pos = _read_varint(view, pos)
            if number in _VARINT_FIELDS:
                numbers[_VARINT_FIELDS[number]] = value
        elif kind == 2:
            length, pos = _read_varint(view, pos)
            if pos + length > len(view):
                raise MalformedChunk("length-delimited field overruns the message")
            if number == 6:
                dtype = bytes(view[pos : pos + length]).decode("utf-8", errors="replace")
            elif number == 8:
                data = view[pos : pos + length]
            pos += length
        elif kind == 1:
            if pos + 8 > len(view):
                raise MalformedChunk("truncated fixed64 field")
            if number == 11:
                numbers["checksum"] = struct.unpack_from("<Q", view, pos)[0]
            pos += 8
        elif kind == 5:
            if pos + 4 > len(view):
                raise MalformedChunk("truncated fixed32 field")
            pos += 4
        else:
            raise MalformedChunk(f"unsupported wire type {kind}")
    if pos != len(view):
        raise MalformedChunk("truncated message")
    numbers["stripes"] = numbers["stripes"] or 1
    return Chunk(dtype=dtype, data=data, **numbers)
