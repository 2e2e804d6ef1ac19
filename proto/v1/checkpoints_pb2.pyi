import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CheckpointInfo(_message.Message):
    __slots__ = ("job_id", "step", "size_bytes", "created")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    size_bytes: int
    created: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., size_bytes: _Optional[int] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListCheckpointsReply(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class DownloadCheckpointRequest(_message.Message):
    __slots__ = ("job_id", "step", "consolidate")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONSOLIDATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    consolidate: bool
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., consolidate: _Optional[bool] = ...) -> None: ...

class DataChunk(_message.Message):
    __slots__ = ("data", "sha256", "object")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sha256: str
    object: str
    def __init__(self, data: _Optional[bytes] = ..., sha256: _Optional[str] = ..., object: _Optional[str] = ...) -> None: ...
