from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GossipCommit(_message.Message):
    __slots__ = ("round", "sender")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    round: int
    sender: int
    def __init__(self, round: _Optional[int] = ..., sender: _Optional[int] = ...) -> None: ...

class GossipCommitted(_message.Message):
    __slots__ = ("kept",)
    KEPT_FIELD_NUMBER: _ClassVar[int]
    kept: bool
    def __init__(self, kept: _Optional[bool] = ...) -> None: ...

class GossipChunk(_message.Message):
    __slots__ = ("round", "sender", "index", "count", "total_bytes", "dtype", "data", "stripe", "stripes", "checksum", "step")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    STRIPES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    round: int
    sender: int
    index: int
    count: int
    total_bytes: int
    dtype: str
    data: bytes
    stripe: int
    stripes: int
    checksum: int
    step: int
    def __init__(self, round: _Optional[int] = ..., sender: _Optional[int] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ..., stripe: _Optional[int] = ..., stripes: _Optional[int] = ..., checksum: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...
