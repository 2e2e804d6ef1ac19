import datetime

from cantata.proto.v1 import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SweepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SWEEP_STATE_UNSPECIFIED: _ClassVar[SweepState]
    SWEEP_RUNNING: _ClassVar[SweepState]
    SWEEP_SUCCEEDED: _ClassVar[SweepState]
    SWEEP_FAILED: _ClassVar[SweepState]
    SWEEP_CANCELLED: _ClassVar[SweepState]
SWEEP_STATE_UNSPECIFIED: SweepState
SWEEP_RUNNING: SweepState
SWEEP_SUCCEEDED: SweepState
SWEEP_FAILED: SweepState
SWEEP_CANCELLED: SweepState

class SweepParameter(_message.Message):
    __slots__ = ("field", "float_range", "int_range", "choices")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    FLOAT_RANGE_FIELD_NUMBER: _ClassVar[int]
    INT_RANGE_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    field: str
    float_range: FloatRange
    int_range: IntRange
    choices: Choices
    def __init__(self, field: _Optional[str] = ..., float_range: _Optional[_Union[FloatRange, _Mapping]] = ..., int_range: _Optional[_Union[IntRange, _Mapping]] = ..., choices: _Optional[_Union[Choices, _Mapping]] = ...) -> None: ...

class FloatRange(_message.Message):
    __slots__ = ("low", "high", "log")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    low: float
    high: float
    log: bool
    def __init__(self, low: _Optional[float] = ..., high: _Optional[float] = ..., log: _Optional[bool] = ...) -> None: ...

class IntRange(_message.Message):
    __slots__ = ("low", "high", "step", "log")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    low: int
    high: int
    step: int
    log: bool
    def __init__(self, low: _Optional[int] = ..., high: _Optional[int] = ..., step: _Optional[int] = ..., log: _Optional[bool] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class SweepSpec(_message.Message):
    __slots__ = ("name", "job", "parameters", "sampler", "pruner", "trials", "concurrency", "seed", "min_resource", "reduction_factor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    PRUNER_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    REDUCTION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    job: _common_pb2.JobSpec
    parameters: _containers.RepeatedCompositeFieldContainer[SweepParameter]
    sampler: str
    pruner: str
    trials: int
    concurrency: int
    seed: int
    min_resource: int
    reduction_factor: int
    def __init__(self, name: _Optional[str] = ..., job: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., parameters: _Optional[_Iterable[_Union[SweepParameter, _Mapping]]] = ..., sampler: _Optional[str] = ..., pruner: _Optional[str] = ..., trials: _Optional[int] = ..., concurrency: _Optional[int] = ..., seed: _Optional[int] = ..., min_resource: _Optional[int] = ..., reduction_factor: _Optional[int] = ...) -> None: ...

class SubmitSweepRequest(_message.Message):
    __slots__ = ("spec", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: SweepSpec
    request_id: str
    def __init__(self, spec: _Optional[_Union[SweepSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class Trial(_message.Message):
    __slots__ = ("number", "job_id", "params", "state", "value", "step", "reason")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    number: int
    job_id: str
    params: _containers.ScalarMap[str, str]
    state: str
    value: float
    step: int
    reason: str
    def __init__(self, number: _Optional[int] = ..., job_id: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., state: _Optional[str] = ..., value: _Optional[float] = ..., step: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SweepInfo(_message.Message):
    __slots__ = ("id", "tenant", "spec", "state", "reason", "trials", "best_trial", "created", "updated", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    BEST_TRIAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    spec: SweepSpec
    state: SweepState
    reason: str
    trials: _containers.RepeatedCompositeFieldContainer[Trial]
    best_trial: int
    created: _timestamp_pb2.Timestamp
    updated: _timestamp_pb2.Timestamp
    request_id: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., spec: _Optional[_Union[SweepSpec, _Mapping]] = ..., state: _Optional[_Union[SweepState, str]] = ..., reason: _Optional[str] = ..., trials: _Optional[_Iterable[_Union[Trial, _Mapping]]] = ..., best_trial: _Optional[int] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class GetSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class ListSweepsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSweepsReply(_message.Message):
    __slots__ = ("sweeps",)
    SWEEPS_FIELD_NUMBER: _ClassVar[int]
    sweeps: _containers.RepeatedCompositeFieldContainer[SweepInfo]
    def __init__(self, sweeps: _Optional[_Iterable[_Union[SweepInfo, _Mapping]]] = ...) -> None: ...

class CancelSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...
