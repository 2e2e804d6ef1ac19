import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    QUEUED: _ClassVar[JobState]
    STARTING: _ClassVar[JobState]
    RUNNING: _ClassVar[JobState]
    CANCELLING: _ClassVar[JobState]
    SUCCEEDED: _ClassVar[JobState]
    FAILED: _ClassVar[JobState]
    CANCELLED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
QUEUED: JobState
STARTING: JobState
RUNNING: JobState
CANCELLING: JobState
SUCCEEDED: JobState
FAILED: JobState
CANCELLED: JobState

class Quota(_message.Message):
    __slots__ = ("max_concurrent_jobs", "max_workers_per_job", "max_total_steps", "max_gpus")
    MAX_CONCURRENT_JOBS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_PER_JOB_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    max_concurrent_jobs: int
    max_workers_per_job: int
    max_total_steps: int
    max_gpus: int
    def __init__(self, max_concurrent_jobs: _Optional[int] = ..., max_workers_per_job: _Optional[int] = ..., max_total_steps: _Optional[int] = ..., max_gpus: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "model", "dataset", "algorithm", "workers", "topology", "local_steps", "optimizer", "steps", "checkpoint_every", "checkpoint_store", "eval_every", "batch_size", "seq_len", "lr", "seed", "outer_lr", "outer_momentum", "gossip_step", "compression", "trace_samples", "on_bad_utf8", "ranks_per_worker", "min_workers", "max_failures", "tags", "round_deadline_s", "round_time_s", "warmup_steps", "lr_schedule", "min_lr_ratio", "weight_decay", "grad_clip", "grad_accum", "eval_batches", "keep_last", "async_checkpoint", "tokenizer", "tokenizer_vocab", "dp_shard", "tp", "dp_replicate", "activation_checkpointing", "mixed_precision", "init_from", "canzona_alpha", "canzona_bucket_elements", "canzona_cost_unit", "muon_momentum", "muon_ns_steps", "muon_ns_dtype", "gpus_per_worker", "on_nonfinite", "spike_zscore", "spike_window", "max_rollbacks", "rollback_lr_scale", "compile", "float8", "pp", "pp_schedule", "pp_microbatches")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    OUTER_LR_FIELD_NUMBER: _ClassVar[int]
    OUTER_MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_STEP_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    TRACE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ON_BAD_UTF8_FIELD_NUMBER: _ClassVar[int]
    RANKS_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_FAILURES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    ROUND_DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    ROUND_TIME_S_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    LR_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    MIN_LR_RATIO_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    GRAD_CLIP_FIELD_NUMBER: _ClassVar[int]
    GRAD_ACCUM_FIELD_NUMBER: _ClassVar[int]
    EVAL_BATCHES_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    ASYNC_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_VOCAB_FIELD_NUMBER: _ClassVar[int]
    DP_SHARD_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    DP_REPLICATE_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    MIXED_PRECISION_FIELD_NUMBER: _ClassVar[int]
    INIT_FROM_FIELD_NUMBER: _ClassVar[int]
    CANZONA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    CANZONA_BUCKET_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    CANZONA_COST_UNIT_FIELD_NUMBER: _ClassVar[int]
    MUON_MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    MUON_NS_STEPS_FIELD_NUMBER: _ClassVar[int]
    MUON_NS_DTYPE_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    ON_NONFINITE_FIELD_NUMBER: _ClassVar[int]
    SPIKE_ZSCORE_FIELD_NUMBER: _ClassVar[int]
    SPIKE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_ROLLBACKS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_LR_SCALE_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    FLOAT8_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    PP_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    PP_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    dataset: str
    algorithm: str
    workers: int
    topology: str
    local_steps: int
    optimizer: str
    steps: int
    checkpoint_every: int
    checkpoint_store: str
    eval_every: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    outer_lr: float
    outer_momentum: float
    gossip_step: float
    compression: str
    trace_samples: bool
    on_bad_utf8: str
    ranks_per_worker: int
    min_workers: int
    max_failures: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    round_deadline_s: float
    round_time_s: float
    warmup_steps: int
    lr_schedule: str
    min_lr_ratio: float
    weight_decay: float
    grad_clip: float
    grad_accum: int
    eval_batches: int
    keep_last: int
    async_checkpoint: bool
    tokenizer: str
    tokenizer_vocab: int
    dp_shard: int
    tp: int
    dp_replicate: int
    activation_checkpointing: bool
    mixed_precision: str
    init_from: str
    canzona_alpha: float
    canzona_bucket_elements: int
    canzona_cost_unit: str
    muon_momentum: float
    muon_ns_steps: int
    muon_ns_dtype: str
    gpus_per_worker: int
    on_nonfinite: str
    spike_zscore: float
    spike_window: int
    max_rollbacks: int
    rollback_lr_scale: float
    compile: bool
    float8: bool
    pp: int
    pp_schedule: str
    pp_microbatches: int
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., dataset: _Optional[str] = ..., algorithm: _Optional[str] = ..., workers: _Optional[int] = ..., topology: _Optional[str] = ..., local_steps: _Optional[int] = ..., optimizer: _Optional[str] = ..., steps: _Optional[int] = ..., checkpoint_every: _Optional[int] = ..., checkpoint_store: _Optional[str] = ..., eval_every: _Optional[int] = ..., batch_size: _Optional[int] = ..., seq_len: _Optional[int] = ..., lr: _Optional[float] = ..., seed: _Optional[int] = ..., outer_lr: _Optional[float] = ..., outer_momentum: _Optional[float] = ..., gossip_step: _Optional[float] = ..., compression: _Optional[str] = ..., trace_samples: _Optional[bool] = ..., on_bad_utf8: _Optional[str] = ..., ranks_per_worker: _Optional[int] = ..., min_workers: _Optional[int] = ..., max_failures: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ..., round_deadline_s: _Optional[float] = ..., round_time_s: _Optional[float] = ..., warmup_steps: _Optional[int] = ..., lr_schedule: _Optional[str] = ..., min_lr_ratio: _Optional[float] = ..., weight_decay: _Optional[float] = ..., grad_clip: _Optional[float] = ..., grad_accum: _Optional[int] = ..., eval_batches: _Optional[int] = ..., keep_last: _Optional[int] = ..., async_checkpoint: _Optional[bool] = ..., tokenizer: _Optional[str] = ..., tokenizer_vocab: _Optional[int] = ..., dp_shard: _Optional[int] = ..., tp: _Optional[int] = ..., dp_replicate: _Optional[int] = ..., activation_checkpointing: _Optional[bool] = ..., mixed_precision: _Optional[str] = ..., init_from: _Optional[str] = ..., canzona_alpha: _Optional[float] = ..., canzona_bucket_elements: _Optional[int] = ..., canzona_cost_unit: _Optional[str] = ..., muon_momentum: _Optional[float] = ..., muon_ns_steps: _Optional[int] = ..., muon_ns_dtype: _Optional[str] = ..., gpus_per_worker: _Optional[int] = ..., on_nonfinite: _Optional[str] = ..., spike_zscore: _Optional[float] = ..., spike_window: _Optional[int] = ..., max_rollbacks: _Optional[int] = ..., rollback_lr_scale: _Optional[float] = ..., compile: _Optional[bool] = ..., float8: _Optional[bool] = ..., pp: _Optional[int] = ..., pp_schedule: _Optional[str] = ..., pp_microbatches: _Optional[int] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("id", "tenant", "spec", "state", "reason", "step", "loss", "val_loss", "created", "updated", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    spec: JobSpec
    state: JobState
    reason: str
    step: int
    loss: float
    val_loss: float
    created: _timestamp_pb2.Timestamp
    updated: _timestamp_pb2.Timestamp
    request_id: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., reason: _Optional[str] = ..., step: _Optional[int] = ..., loss: _Optional[float] = ..., val_loss: _Optional[float] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...
