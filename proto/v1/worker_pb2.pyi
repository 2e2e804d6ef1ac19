from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Progress(_message.Message):
    __slots__ = ("step", "loss", "tokens_per_s", "lr", "tokens", "step_time_s", "data_wait_s", "grad_norm", "optimizer")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    DATA_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    step: int
    loss: float
    tokens_per_s: float
    lr: float
    tokens: int
    step_time_s: float
    data_wait_s: float
    grad_norm: float
    optimizer: OptimizerWindow
    def __init__(self, step: _Optional[int] = ..., loss: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., lr: _Optional[float] = ..., tokens: _Optional[int] = ..., step_time_s: _Optional[float] = ..., data_wait_s: _Optional[float] = ..., grad_norm: _Optional[float] = ..., optimizer: _Optional[_Union[OptimizerWindow, _Mapping]] = ...) -> None: ...

class OptimizerWindow(_message.Message):
    __slots__ = ("step_s", "sent_bytes", "compute_s", "compute_imbalance", "ns_flops_imbalance", "owned_matrices", "updated_matrices")
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    NS_FLOPS_IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    OWNED_MATRICES_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MATRICES_FIELD_NUMBER: _ClassVar[int]
    step_s: float
    sent_bytes: float
    compute_s: float
    compute_imbalance: float
    ns_flops_imbalance: float
    owned_matrices: float
    updated_matrices: float
    def __init__(self, step_s: _Optional[float] = ..., sent_bytes: _Optional[float] = ..., compute_s: _Optional[float] = ..., compute_imbalance: _Optional[float] = ..., ns_flops_imbalance: _Optional[float] = ..., owned_matrices: _Optional[float] = ..., updated_matrices: _Optional[float] = ...) -> None: ...

class Eval(_message.Message):
    __slots__ = ("step", "val_loss")
    STEP_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    step: int
    val_loss: float
    def __init__(self, step: _Optional[int] = ..., val_loss: _Optional[float] = ...) -> None: ...

class CheckpointWritten(_message.Message):
    __slots__ = ("step", "uri", "size_bytes", "seconds")
    STEP_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    step: int
    uri: str
    size_bytes: int
    seconds: float
    def __init__(self, step: _Optional[int] = ..., uri: _Optional[str] = ..., size_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("final_val_loss",)
    FINAL_VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    final_val_loss: float
    def __init__(self, final_val_loss: _Optional[float] = ...) -> None: ...

class Failed(_message.Message):
    __slots__ = ("reason", "permanent")
    REASON_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    permanent: bool
    def __init__(self, reason: _Optional[str] = ..., permanent: _Optional[bool] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class StoreOutage(_message.Message):
    __slots__ = ("uri", "reachable", "cause", "retry_for_s", "seconds")
    URI_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    RETRY_FOR_S_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    uri: str
    reachable: bool
    cause: str
    retry_for_s: float
    seconds: float
    def __init__(self, uri: _Optional[str] = ..., reachable: _Optional[bool] = ..., cause: _Optional[str] = ..., retry_for_s: _Optional[float] = ..., seconds: _Optional[float] = ...) -> None: ...

class GossipEndpoint(_message.Message):
    __slots__ = ("address", "first_round")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FIRST_ROUND_FIELD_NUMBER: _ClassVar[int]
    address: str
    first_round: int
    def __init__(self, address: _Optional[str] = ..., first_round: _Optional[int] = ...) -> None: ...

class Round(_message.Message):
    __slots__ = ("round", "peers", "skipped", "seconds", "inner_steps", "bytes_sent", "deadline_s", "step_time_s", "traffic")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    round: int
    peers: _containers.RepeatedScalarFieldContainer[int]
    skipped: _containers.RepeatedScalarFieldContainer[int]
    seconds: float
    inner_steps: int
    bytes_sent: int
    deadline_s: float
    step_time_s: float
    traffic: _containers.RepeatedCompositeFieldContainer[PeerTraffic]
    def __init__(self, round: _Optional[int] = ..., peers: _Optional[_Iterable[int]] = ..., skipped: _Optional[_Iterable[int]] = ..., seconds: _Optional[float] = ..., inner_steps: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., deadline_s: _Optional[float] = ..., step_time_s: _Optional[float] = ..., traffic: _Optional[_Iterable[_Union[PeerTraffic, _Mapping]]] = ...) -> None: ...

class PeerTraffic(_message.Message):
    __slots__ = ("peer", "bytes_sent", "bytes_received")
    PEER_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    peer: int
    bytes_sent: int
    bytes_received: int
    def __init__(self, peer: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class Anomaly(_message.Message):
    __slots__ = ("peer", "round", "check", "verdict", "score", "quarantined", "detail")
    PEER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    peer: int
    round: int
    check: str
    verdict: str
    score: float
    quarantined: bool
    detail: str
    def __init__(self, peer: _Optional[int] = ..., round: _Optional[int] = ..., check: _Optional[str] = ..., verdict: _Optional[str] = ..., score: _Optional[float] = ..., quarantined: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class GossipRefused(_message.Message):
    __slots__ = ("address", "principal", "reason")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    address: str
    principal: str
    reason: str
    def __init__(self, address: _Optional[str] = ..., principal: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Rollback(_message.Message):
    __slots__ = ("step", "checkpoint_step", "cause", "loss", "zscore", "skipped_from", "skipped_to", "rollback", "lr_scale")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    ZSCORE_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FROM_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_TO_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    LR_SCALE_FIELD_NUMBER: _ClassVar[int]
    step: int
    checkpoint_step: int
    cause: str
    loss: float
    zscore: float
    skipped_from: int
    skipped_to: int
    rollback: int
    lr_scale: float
    def __init__(self, step: _Optional[int] = ..., checkpoint_step: _Optional[int] = ..., cause: _Optional[str] = ..., loss: _Optional[float] = ..., zscore: _Optional[float] = ..., skipped_from: _Optional[int] = ..., skipped_to: _Optional[int] = ..., rollback: _Optional[int] = ..., lr_scale: _Optional[float] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("cpu_percent", "memory_bytes", "gpu_memory_bytes")
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpu_percent: float
    memory_bytes: float
    gpu_memory_bytes: float
    def __init__(self, cpu_percent: _Optional[float] = ..., memory_bytes: _Optional[float] = ..., gpu_memory_bytes: _Optional[float] = ...) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("job_id", "worker", "started", "progress", "eval", "checkpoint", "finished", "failed", "message", "gossip", "round", "anomaly", "refused", "heartbeat", "store_outage", "rollback", "seq")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ANOMALY_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STORE_OUTAGE_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker: int
    started: bool
    progress: Progress
    eval: Eval
    checkpoint: CheckpointWritten
    finished: Finished
    failed: Failed
    message: Message
    gossip: GossipEndpoint
    round: Round
    anomaly: Anomaly
    refused: GossipRefused
    heartbeat: Heartbeat
    store_outage: StoreOutage
    rollback: Rollback
    seq: int
    def __init__(self, job_id: _Optional[str] = ..., worker: _Optional[int] = ..., started: _Optional[bool] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., eval: _Optional[_Union[Eval, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointWritten, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., failed: _Optional[_Union[Failed, _Mapping]] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., gossip: _Optional[_Union[GossipEndpoint, _Mapping]] = ..., round: _Optional[_Union[Round, _Mapping]] = ..., anomaly: _Optional[_Union[Anomaly, _Mapping]] = ..., refused: _Optional[_Union[GossipRefused, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., store_outage: _Optional[_Union[StoreOutage, _Mapping]] = ..., rollback: _Optional[_Union[Rollback, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class WorkerReportReply(_message.Message):
    __slots__ = ("stop", "heartbeat_interval_s")
    STOP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    stop: bool
    heartbeat_interval_s: float
    def __init__(self, stop: _Optional[bool] = ..., heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class GetPeersRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetPeersReply(_message.Message):
    __slots__ = ("peers", "round", "rounds", "restarts")
    class PeersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    class RoundsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class RestartsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    PEERS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.ScalarMap[int, str]
    round: int
    rounds: _containers.ScalarMap[int, int]
    restarts: _containers.ScalarMap[int, int]
    def __init__(self, peers: _Optional[_Mapping[int, str]] = ..., round: _Optional[int] = ..., rounds: _Optional[_Mapping[int, int]] = ..., restarts: _Optional[_Mapping[int, int]] = ...) -> None: ...
