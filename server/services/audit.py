"""Audit: verified reports over the control plane, scoped to the caller's tenant."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from cantata.proto.v1 import audit_pb2, audit_pb2_grpc
from cantata.security.audit import REPORT_FORMATS, build_report, render_report
from cantata.server.auth import TENANT, caller
from cantata.server.errors import InvalidRequest
from cantata.server.store import NotFound


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
        me = caller(context)
        tenant = request.tenant or None
        if me.role == TENANT:
            if tenant not in (None, me.name):
                raise NotFound(f"tenant {request.tenant!r} not found")
            tenant = me.name
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
