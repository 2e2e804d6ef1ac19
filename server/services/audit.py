"""Audit: verified reports and record lookup over the control plane, scoped to the caller's tenant."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from cantata.proto.v1 import audit_pb2, audit_pb2_grpc
from cantata.security.audit import (
    REPORT_FORMATS,
    REQUEST_ID_DETAIL,
    AuditRecord,
    build_report,
    find_records,
    render_report,
)
from cantata.security.audit.record import format_time
from cantata.server.auth import TENANT, caller
from cantata.server.errors import InvalidRequest
from cantata.server.store import NotFound

MAX_PAGE = 1000


def _time(text: str, field: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"{field}: not an ISO 8601 time: {text!r}", field=field) from None


class AuditService(audit_pb2_grpc.AuditServicer):
    def __init__(self, directory: Path, flush):
        self._directory = directory
        self._flush = flush  # signs a checkpoint so the report covers everything so far

    def GetReport(self, request, context):
        tenant = _scope(context, request.tenant)
        fmt = request.format or "text"
        if fmt not in REPORT_FORMATS:
            raise InvalidRequest(f"format: one of {', '.join(REPORT_FORMATS)}", field="format")
        since, until = _time(request.since, "since"), _time(request.until, "until")
        self._flush()
        report = build_report(self._directory, tenant=tenant, since=since, until=until)
        result = report.verification
        verdict = (
            f"audit log intact: {result.records_valid}/{result.records_total} records, "
            f"{result.checkpoints_valid}/{result.checkpoints_total} checkpoints valid"
            if result.ok
            else "AUDIT LOG BROKEN: " + result.summary().splitlines()[-1]
        )
        return audit_pb2.GetReportReply(intact=result.ok, verdict=verdict, content=render_report(report, fmt))

    def ListEvents(self, request, context):
        """Records oldest first, filtered; the page token is the last sequence number sent."""
        tenant = _scope(context, request.tenant)
        since, until = _time(request.since, "since"), _time(request.until, "until")
        if request.page_size < 0:
            raise InvalidRequest("page_size: must be >= 0", field="page_size")
        size = min(request.page_size or 100, MAX_PAGE)
        try:
            after = int(request.page_token or 0)
        except ValueError:
            raise InvalidRequest(f"page_token: not a token this server gave: {request.page_token!r}") from None
        records = find_records(
            self._directory,
            tenant=tenant,
            action=request.action,
            request_id=request.request_id,
            since=since,
            until=until,
            after=after,
            limit=size + 1,
        )
        me = caller(context).uri
        events = [_event(r, show_peer=tenant is None or r.actor == me) for r in records]
        token = str(events[size - 1].seq) if len(events) > size else ""
        return audit_pb2.ListEventsReply(events=events[:size], next_page_token=token)


def _scope(context, requested: str) -> str | None:
    """Whose records the caller may see: an admin any tenant's or all (None); a tenant only its own."""
    me = caller(context)
    if me.role != TENANT:
        return requested or None
    if requested not in ("", me.name):
        raise NotFound(f"tenant {requested!r} not found")
    return me.name


def _event(record: AuditRecord, *, show_peer: bool) -> audit_pb2.AuditEvent:
    """The record as the lookup returns it; a tenant sees the network address only of its own calls."""
    request_id = record.details.get(REQUEST_ID_DETAIL)
    return audit_pb2.AuditEvent(
        seq=record.seq,
        time=format_time(record.time),
        actor=record.actor,
        action=record.action,
        resource=record.resource,
        tenant=record.tenant,
        outcome=record.outcome,
        peer=record.peer if show_peer else "",
        request_id=request_id if isinstance(request_id, str) else "",
        details_json=json.dumps(record.details, sort_keys=True),
    )
