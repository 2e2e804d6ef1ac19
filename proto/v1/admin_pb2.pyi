from cantata.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TenantInfo(_message.Message):
    __slots__ = ("name", "status", "csr_fingerprint", "quota", "running_jobs", "approved_by", "requested_at", "certificate_serial", "certificate_expires", "retention_days")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CSR_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    APPROVED_BY_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_SERIAL_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: str
    csr_fingerprint: str
    quota: _common_pb2.Quota
    running_jobs: int
    approved_by: str
    requested_at: str
    certificate_serial: str
    certificate_expires: str
    retention_days: int
    def __init__(self, name: _Optional[str] = ..., status: _Optional[str] = ..., csr_fingerprint: _Optional[str] = ..., quota: _Optional[_Union[_common_pb2.Quota, _Mapping]] = ..., running_jobs: _Optional[int] = ..., approved_by: _Optional[str] = ..., requested_at: _Optional[str] = ..., certificate_serial: _Optional[str] = ..., certificate_expires: _Optional[str] = ..., retention_days: _Optional[int] = ...) -> None: ...

class SetRetentionRequest(_message.Message):
    __slots__ = ("name", "retention_days")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    name: str
    retention_days: int
    def __init__(self, name: _Optional[str] = ..., retention_days: _Optional[int] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    def __init__(self, status: _Optional[str] = ...) -> None: ...

class ListTenantsReply(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantInfo]
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantInfo, _Mapping]]] = ...) -> None: ...

class ApproveTenantRequest(_message.Message):
    __slots__ = ("name", "csr_fingerprint", "quota")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CSR_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    name: str
    csr_fingerprint: str
    quota: _common_pb2.Quota
    def __init__(self, name: _Optional[str] = ..., csr_fingerprint: _Optional[str] = ..., quota: _Optional[_Union[_common_pb2.Quota, _Mapping]] = ...) -> None: ...

class TenantActionRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("name", "quota")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    name: str
    quota: _common_pb2.Quota
    def __init__(self, name: _Optional[str] = ..., quota: _Optional[_Union[_common_pb2.Quota, _Mapping]] = ...) -> None: ...

class RevokeCertificateRequest(_message.Message):
    __slots__ = ("serial", "reason")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    serial: str
    reason: str
    def __init__(self, serial: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeCertificateReply(_message.Message):
    __slots__ = ("serial", "principal")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    serial: str
    principal: str
    def __init__(self, serial: _Optional[str] = ..., principal: _Optional[str] = ...) -> None: ...

class ListAnomaliesRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class AnomalyRecord(_message.Message):
    __slots__ = ("reporter", "peer", "round", "check", "verdict", "score", "quarantined", "time")
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    reporter: int
    peer: int
    round: int
    check: str
    verdict: str
    score: float
    quarantined: bool
    time: str
    def __init__(self, reporter: _Optional[int] = ..., peer: _Optional[int] = ..., round: _Optional[int] = ..., check: _Optional[str] = ..., verdict: _Optional[str] = ..., score: _Optional[float] = ..., quarantined: _Optional[bool] = ..., time: _Optional[str] = ...) -> None: ...

class ListAnomaliesReply(_message.Message):
    __slots__ = ("anomalies",)
    ANOMALIES_FIELD_NUMBER: _ClassVar[int]
    anomalies: _containers.RepeatedCompositeFieldContainer[AnomalyRecord]
    def __init__(self, anomalies: _Optional[_Iterable[_Union[AnomalyRecord, _Mapping]]] = ...) -> None: ...

class SimulateAttackRequest(_message.Message):
    __slots__ = ("job_id", "workers", "attack", "strength")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ATTACK_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workers: _containers.RepeatedScalarFieldContainer[int]
    attack: str
    strength: float
    def __init__(self, job_id: _Optional[str] = ..., workers: _Optional[_Iterable[int]] = ..., attack: _Optional[str] = ..., strength: _Optional[float] = ...) -> None: ...

class SimulateAttackReply(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class InjectFaultRequest(_message.Message):
    __slots__ = ("job_id", "fault", "step", "scale", "times", "workers")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    TIMES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fault: str
    step: int
    scale: float
    times: int
    workers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[str] = ..., fault: _Optional[str] = ..., step: _Optional[int] = ..., scale: _Optional[float] = ..., times: _Optional[int] = ..., workers: _Optional[_Iterable[int]] = ...) -> None: ...

class InjectFaultReply(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class RotateTenantKeyRequest(_message.Message):
    __slots__ = ("tenant", "retire_unused")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RETIRE_UNUSED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    retire_unused: bool
    def __init__(self, tenant: _Optional[str] = ..., retire_unused: _Optional[bool] = ...) -> None: ...

class RotateTenantKeyReply(_message.Message):
    __slots__ = ("version", "objects_rewrapped", "retired")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_REWRAPPED_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    version: int
    objects_rewrapped: int
    retired: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, version: _Optional[int] = ..., objects_rewrapped: _Optional[int] = ..., retired: _Optional[_Iterable[int]] = ...) -> None: ...

class AddScraperRequest(_message.Message):
    __slots__ = ("name", "csr_pem")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    name: str
    csr_pem: bytes
    def __init__(self, name: _Optional[str] = ..., csr_pem: _Optional[bytes] = ...) -> None: ...

class AddScraperReply(_message.Message):
    __slots__ = ("cert_pem", "serial", "metrics_address")
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cert_pem: bytes
    serial: str
    metrics_address: str
    def __init__(self, cert_pem: _Optional[bytes] = ..., serial: _Optional[str] = ..., metrics_address: _Optional[str] = ...) -> None: ...
