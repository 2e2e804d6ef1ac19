"""The Cantata SDK: ``Client.from_profile(name).submit(Job(...))``.

Names are imported from their modules on first use, so that the CLI starts
without loading gRPC for commands that do not need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cantata.sdk.client import Checkpoint, Client, DataSource, Event, JobHandle, JobStatus, MetricRow, Tenant
    from cantata.sdk.errors import (
        CantataError,
        Conflict,
        DataLoss,
        InvalidArgument,
        InvalidJob,
        InvalidWebhook,
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
    from cantata.sdk.webhooks import InvalidSignature, Webhook, WebhookDelivery, verify_signature

_HOMES = {
    **dict.fromkeys(
        ("Checkpoint", "Client", "DataSource", "Event", "JobHandle", "JobStatus", "MetricRow", "Tenant"), "client"
    ),
    **dict.fromkeys(
        (
            "CantataError",
            "Conflict",
            "DataLoss",
            "InvalidArgument",
            "InvalidJob",
            "InvalidWebhook",
            "NotFound",
            "PermissionDenied",
            "QuotaExceeded",
            "StoreFull",
            "StreamInterrupted",
            "Unauthenticated",
            "Unavailable",
            "WaitTimedOut",
        ),
        "errors",
    ),
    "Job": "job",
    **dict.fromkeys(("InvalidSignature", "Webhook", "WebhookDelivery", "verify_signature"), "webhooks"),
}

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
    "InvalidSignature",
    "InvalidWebhook",
    "Job",
    "JobHandle",
    "JobStatus",
    "MetricRow",
    "NotFound",
    "PermissionDenied",
    "QuotaExceeded",
    "StoreFull",
    "StreamInterrupted",
    "Tenant",
    "Unauthenticated",
    "Unavailable",
    "WaitTimedOut",
    "Webhook",
    "WebhookDelivery",
    "verify_signature",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cantata.sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cantata.sdk.{home}"), name)
