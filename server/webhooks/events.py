"""Which job events become webhook events, and the JSON body each delivery carries.

:data:`WEBHOOK_EVENTS` is the one list of what is delivered: a job event's
kind (and, for a state change, its state) maps to the event type a tenant
subscribes to. An event id is the job id and the event's sequence number, the
same for every endpoint and every retry, so a receiver drops duplicates by it.
"""

from __future__ import annotations

import json

from cantata.proto.v1 import common_pb2, jobs_pb2

# (job event kind, its state for STATE events else 0) -> the webhook event type.
WEBHOOK_EVENTS: dict[tuple[int, int], str] = {
    (jobs_pb2.STATE, common_pb2.QUEUED): "job.queued",
    (jobs_pb2.STATE, common_pb2.RUNNING): "job.running",
    (jobs_pb2.STATE, common_pb2.SUCCEEDED): "job.succeeded",
    (jobs_pb2.STATE, common_pb2.FAILED): "job.failed",
    (jobs_pb2.STATE, common_pb2.CANCELLED): "job.cancelled",
    (jobs_pb2.ANOMALY, 0): "job.anomaly",  # an update failed screening; the message says if its sender was quarantined
    (jobs_pb2.ROLLBACK, 0): "job.rollback",  # the recovery policy rolled the job back to a checkpoint
}
EVENT_TYPES: tuple[str, ...] = tuple(WEBHOOK_EVENTS.values())


def event_type(event: jobs_pb2.JobEvent) -> str | None:
    """The webhook event type of a job event, or None when no webhook delivers it."""
    return WEBHOOK_EVENTS.get((event.kind, event.state if event.kind == jobs_pb2.STATE else 0))


def event_id(job_id: str, seq: int) -> str:
    return f"evt_{job_id}_{seq}"


def body(kind: str, job_id: str, tenant: str, event: jobs_pb2.JobEvent) -> bytes:
    """The delivery's JSON body: ``id``, ``type``, ``created`` and the job event as ``data``."""
    data: dict[str, object] = {
        "job_id": job_id,
        "seq": event.seq,
        "state": common_pb2.JobState.Name(event.state).lower() if event.state else None,
        "terminal": event.terminal,
        "step": event.step,
        "total_steps": event.total_steps,
        "message": event.message,
    }
    if event.worker:
        data["worker"] = event.worker
    document = {
        "id": event_id(job_id, event.seq),
        "type": kind,
        "created": event.time.ToJsonString(),
        "tenant": tenant,
        "data": data,
    }
    return json.dumps(document, separators=(",", ":")).encode()
