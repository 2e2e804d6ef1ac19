"""The Cantata SDK: ``Client.from_profile(name).submit(Job(...))``.

Names are imported from their modules on first use, so that the CLI starts
without loading gRPC for commands that do not need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cantata.sdk.checkpoints import Checkpoint
    from cantata.sdk.client import Client
    from cantata.sdk.datasources import DataSource
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
    from cantata.sdk.jobs import Event, JobHandle, JobStatus, MetricRow
    from cantata.sdk.tenants import Tenant
    from cantata.sdk.webhooks import InvalidSignature, Webhook, WebhookDelivery, verify_signature

_HOMES = {
    "Checkpoint": "checkpoints",
    "Client": "client",
    "DataSource": "datasources",
    **dict.fromkeys(("Event", "JobHandle", "JobStatus", "MetricRow"), "jobs"),
    "Tenant": "tenants",
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
