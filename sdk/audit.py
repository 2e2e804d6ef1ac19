"""``client.audit``: verified audit reports and individual audit records."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass

from cantata.proto.v1 import audit_pb2
from cantata.sdk.resource import Resource, utc


@dataclass(frozen=True)
class AuditEvent:
    """One audit record as the lookup shows it; ``request_id`` is the id the client saw in the reply."""

    seq: int
    time: str
    actor: str
    action: str
    resource: str
    tenant: str
    outcome: str
    peer: str
    request_id: str
    details: dict

    @classmethod
    def from_proto(cls, e: audit_pb2.AuditEvent) -> AuditEvent:
        return cls(
            e.seq,
            e.time,
            e.actor,
            e.action,
            e.resource,
            e.tenant,
            e.outcome,
            e.peer,
            e.request_id,
            json.loads(e.details_json or "{}"),
        )


@dataclass(frozen=True)
class AuditReport:
    intact: bool
    verdict: str
    content: str


class Audit(Resource):
    """``client.audit``: a tenant sees its own records; an admin any tenant's or all."""

    def report(self, *, tenant: str = "", since: str = "", until: str = "", fmt: str = "text") -> AuditReport:
        """A verified audit report: a tenant gets its own records, an admin any tenant's or all."""
        reply = self._call(
            self._client._audit.GetReport,
            audit_pb2.GetReportRequest(tenant=tenant, since=since, until=until, format=fmt),
        )
        return AuditReport(reply.intact, reply.verdict, reply.content)

    def events(
        self,
        *,
        tenant: str = "",
        action: str = "",
        since: dt.datetime | str | None = None,
        until: dt.datetime | str | None = None,
        request_id: str = "",
        page_size: int = 500,
    ) -> Iterator[AuditEvent]:
        """Individual audit records, oldest first, filtered like CloudTrail's lookup (filters combine with AND).

        A tenant sees only its own records; an admin any tenant's (``tenant``) or all. ``since`` is
        inclusive, ``until`` exclusive. The records are read, not proven: ``audit report`` verifies.
        """
        request = audit_pb2.ListEventsRequest(
            tenant=tenant,
            action=action,
            since=utc(since).isoformat() if since is not None else "",
            until=utc(until).isoformat() if until is not None else "",
            request_id=request_id,
            page_size=page_size,
        )
        while True:
            reply = self._call(self._client._audit.ListEvents, request)
            yield from (AuditEvent.from_proto(e) for e in reply.events)
            request.page_token = reply.next_page_token
            if not request.page_token:
                return
