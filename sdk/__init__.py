"""The Cantata SDK: ``Client.from_profile(name).submit(Job(...))``."""

from cantata.sdk.client import Checkpoint, Client, DataSource, Event, JobHandle, JobStatus, Tenant
from cantata.sdk.errors import (
    CantataError,
    Conflict,
    DataLoss,
    InvalidArgument,
    InvalidJob,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    StoreFull,
    StreamInterrupted,
    Unauthenticated,
    Unavailable,
    WaitTimedOut,
)
from cantata.sdk.job import Job

__all__ = [
    "CantataError",
    "Checkpoint",
    "Client",
    "Conflict",
    "DataLoss",
    "DataSource",
    "Event",
    "InvalidArgument",
    "InvalidJob",
    "Job",
    "JobHandle",
    "JobStatus",
    "NotFound",
    "PermissionDenied",
    "QuotaExceeded",
    "StoreFull",
    "StreamInterrupted",
    "Tenant",
    "Unauthenticated",
    "Unavailable",
    "WaitTimedOut",
]
