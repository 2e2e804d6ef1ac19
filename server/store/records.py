"""What the store's repositories return: tenants, jobs, workers and anomalies as records, and the job states' rules."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import TERMINAL_STATES as TERMINAL

ACTIVE = frozenset({common_pb2.STARTING, common_pb2.RUNNING, common_pb2.CANCELLING})
# Ended states a tenant may resume from (``Store.resume_job``): the one way out of a terminal state.
RESUMABLE = frozenset({common_pb2.FAILED, common_pb2.CANCELLED})

# Allowed transitions. RUNNING/STARTING -> QUEUED is a requeue after the server
# itself was stopped or killed: the job resumes from its last checkpoint.
TRANSITIONS = {
    common_pb2.QUEUED: {common_pb2.STARTING, common_pb2.CANCELLED, common_pb2.FAILED},
    common_pb2.STARTING: {
        common_pb2.RUNNING,
        common_pb2.CANCELLING,
        common_pb2.FAILED,
        common_pb2.QUEUED,
        common_pb2.SUCCEEDED,
    },
    common_pb2.RUNNING: {common_pb2.CANCELLING, common_pb2.SUCCEEDED, common_pb2.FAILED, common_pb2.QUEUED},
    common_pb2.CANCELLING: {common_pb2.CANCELLED, common_pb2.FAILED},
}


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def sql_in(values: frozenset[int]) -> str:
    """``values`` as the list of an SQL ``IN (...)``."""
    return ", ".join(str(int(v)) for v in sorted(values))


@dataclass
class Tenant:
    name: str
    status: str
    csr_pem: bytes
    csr_fingerprint: str
    cert_pem: bytes | None
    quota: common_pb2.Quota
    requested_at: str
    approved_by: str
    retention_days: int = 0  # ended jobs older than this are deleted; 0 keeps them


@dataclass
class JobRecord:
    id: str
    tenant: str
    request_id: str
    spec: common_pb2.JobSpec
    state: common_pb2.JobState
    reason: str
    step: int
    loss: float
    val_loss: float
    attempts: int  # starts, whatever ended the previous one
    created_at: str
    updated_at: str
    failures: int = 0  # worker failures it restarted after (server restarts are none)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass
class WorkerRecord:
    job_id: str
    idx: int
    pid: int
    finished: bool
    failure: str
    restarts: int
    gossip_address: str
    started_at: int = 0  # the process's start time in clock ticks since boot (0: unknown)


@dataclass
class AnomalyRecord:
    job_id: str
    reporter: int
    peer: int
    round: int
    check: str
    verdict: str
    score: float
    quarantined: bool
    time: str
