from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Progress(_message.Message):
    __slots__ = ("step", "loss", "tokens_per_s", "lr")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    step: int
    loss: float
    tokens_per_s: float
    lr: float
    def __init__(self, step: _Optional[int] = ..., loss: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., lr: _Optional[float] = ...) -> None: ...

class Eval(_message.Message):
    __slots__ = ("step", "val_loss")
    STEP_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    step: int
    val_loss: float
    def __init__(self, step: _Optional[int] = ..., val_loss: _Optional[float] = ...) -> None: ...

class CheckpointWritten(_message.Message):
    __slots__ = ("step", "uri", "size_bytes")
    STEP_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    step: int
    uri: str
    size_bytes: int
    def __init__(self, step: _Optional[int] = ..., uri: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("final_val_loss",)
    FINAL_VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    final_val_loss: float
    def __init__(self, final_val_loss: _Optional[float] = ...) -> None: ...

class Failed(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("job_id", "worker", "started", "progress", "eval", "checkpoint", "finished", "failed", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker: int
    started: bool
    progress: Progress
    eval: Eval
    checkpoint: CheckpointWritten
    finished: Finished
    failed: Failed
    message: Message
    def __init__(self, job_id: _Optional[str] = ..., worker: _Optional[int] = ..., started: _Optional[bool] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., eval: _Optional[_Union[Eval, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointWritten, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., failed: _Optional[_Union[Failed, _Mapping]] = ..., message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class WorkerReportReply(_message.Message):
    __slots__ = ("stop",)
    STOP_FIELD_NUMBER: _ClassVar[int]
    stop: bool
    def __init__(self, stop: _Optional[bool] = ...) -> None: ...
