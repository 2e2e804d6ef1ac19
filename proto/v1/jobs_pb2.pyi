import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from cantata.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    STATE: _ClassVar[EventKind]
    PROGRESS: _ClassVar[EventKind]
    EVAL: _ClassVar[EventKind]
    CHECKPOINT: _ClassVar[EventKind]
    MESSAGE: _ClassVar[EventKind]
    ROUND: _ClassVar[EventKind]
    ANOMALY: _ClassVar[EventKind]
    ROLLBACK: _ClassVar[EventKind]
EVENT_KIND_UNSPECIFIED: EventKind
STATE: EventKind
PROGRESS: EventKind
EVAL: EventKind
CHECKPOINT: EventKind
MESSAGE: EventKind
ROUND: EventKind
ANOMALY: EventKind
ROLLBACK: EventKind

class GetMetricsRequest(_message.Message):
    __slots__ = ("job_id", "names", "since", "after", "page_size")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    names: _containers.RepeatedScalarFieldContainer[str]
    since: _timestamp_pb2.Timestamp
    after: int
    page_size: int
    def __init__(self, job_id: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., after: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class MetricPoint(_message.Message):
    __slots__ = ("seq", "time", "step", "worker", "name", "value", "peer")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: _timestamp_pb2.Timestamp
    step: int
    worker: int
    name: str
    value: float
    peer: int
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., step: _Optional[int] = ..., worker: _Optional[int] = ..., name: _Optional[str] = ..., value: _Optional[float] = ..., peer: _Optional[int] = ...) -> None: ...

class GetMetricsReply(_message.Message):
    __slots__ = ("points", "next_after")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[MetricPoint]
    next_after: int
    def __init__(self, points: _Optional[_Iterable[_Union[MetricPoint, _Mapping]]] = ..., next_after: _Optional[int] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("request_id", "spec", "dry_run")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    spec: _common_pb2.JobSpec
    dry_run: bool
    def __init__(self, request_id: _Optional[str] = ..., spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "states", "tag", "since")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.JobState]
    tag: str
    since: _timestamp_pb2.Timestamp
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_common_pb2.JobState, str]]] = ..., tag: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.JobInfo]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_common_pb2.JobInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("job_id", "workers", "dp_replicate", "dp_shard", "tp", "steps")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    DP_REPLICATE_FIELD_NUMBER: _ClassVar[int]
    DP_SHARD_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workers: int
    dp_replicate: int
    dp_shard: int
    tp: int
    steps: int
    def __init__(self, job_id: _Optional[str] = ..., workers: _Optional[int] = ..., dp_replicate: _Optional[int] = ..., dp_shard: _Optional[int] = ..., tp: _Optional[int] = ..., steps: _Optional[int] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobReply(_message.Message):
    __slots__ = ("job_id", "checkpoint_objects_deleted")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_OBJECTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    checkpoint_objects_deleted: int
    def __init__(self, job_id: _Optional[str] = ..., checkpoint_objects_deleted: _Optional[int] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id", "cursor")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    cursor: int
    def __init__(self, job_id: _Optional[str] = ..., cursor: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("seq", "time", "kind", "state", "terminal", "step", "total_steps", "loss", "val_loss", "tokens_per_s", "message", "worker")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: _timestamp_pb2.Timestamp
    kind: EventKind
    state: _common_pb2.JobState
    terminal: bool
    step: int
    total_steps: int
    loss: float
    val_loss: float
    tokens_per_s: float
    message: str
    worker: int
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[_Union[EventKind, str]] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., terminal: _Optional[bool] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., loss: _Optional[float] = ..., val_loss: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., message: _Optional[str] = ..., worker: _Optional[int] = ...) -> None: ...

class ReadLogsRequest(_message.Message):
    __slots__ = ("job_id", "offset", "follow")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    offset: int
    follow: bool
    def __init__(self, job_id: _Optional[str] = ..., offset: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("offset", "worker", "line")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    worker: int
    line: str
    def __init__(self, offset: _Optional[int] = ..., worker: _Optional[int] = ..., line: _Optional[str] = ...) -> None: ...
