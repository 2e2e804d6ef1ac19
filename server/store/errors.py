"""The store's errors: what a caller is refused, and why."""

from __future__ import annotations

from cantata.proto.v1 import common_pb2
from cantata.server.store.records import JobRecord


class StoreError(Exception):
    """Base class of store errors."""


class NotFound(StoreError):
    """No such object for this caller."""


class Conflict(StoreError):
    """The object exists or is in a state that forbids the change."""


class NotResumable(Conflict):
    """Only a FAILED or CANCELLED job can be resumed."""

    def __init__(self, job: JobRecord):
        state = common_pb2.JobState.Name(job.state)
        why = "it finished: there is nothing left to train" if job.state == common_pb2.SUCCEEDED else "it has not ended"
        super().__init__(
            f"job {job.id!r} is {state} and cannot be resumed ({why}); only a FAILED or CANCELLED job can, "
            "or a SUCCEEDED one given more steps"
        )


class NotEnded(Conflict):
    """Only an ended job can be deleted."""

    def __init__(self, job: JobRecord):
        state = common_pb2.JobState.Name(job.state)
        super().__init__(f"job {job.id!r} is {state}: only an ended job can be deleted (cancel it first)")


class RequestIdReused(Conflict):
    """A submit reused a request id of one of the tenant's jobs with a different spec."""

    def __init__(self, request_id: str, job_id: str):
        super().__init__(f"request_id {request_id!r} was already used for {job_id} with a different job spec")
        self.request_id, self.job_id = request_id, job_id


class QuotaExceeded(StoreError):
    def __init__(self, what: str, limit: int, used: int):
        super().__init__(f"quota exceeded: {what} limit {limit}, in use {used}")
        self.what, self.limit, self.used = what, limit, used
