"""The audit report: verdict first, then counts, timeline, refusals, anomalies and approvals, in four formats."""

from __future__ import annotations

import json
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from cantata.security.audit import (
    Action,
    AuditLog,
    build_report,
    init_audit,
    render_report,
)

ADMIN = "spiffe://cantata/admin/root"


def _tenant(name: str) -> str:
    return f"spiffe://cantata/tenant/{name}"


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, object]:
    """A small platform history in two periods; returns the log directory and the first record of period two."""
    directory = tmp_path_factory.mktemp("report") / "audit"
    init_audit(directory)
    with AuditLog.open(directory) as log:
        log.append(ADMIN, Action.SERVER_STARTED)
        for name in ("acme", "globex"):
            log.append("anonymous", Action.TENANCY_REQUESTED, resource=name, tenant=name, peer="ipv4:10.1.1.1:1")
            log.append(ADMIN, Action.TENANT_APPROVED, resource=name, tenant=name, details={"max_workers": 4})
        log.append(_tenant("acme"), Action.JOB_SUBMITTED, resource="job-a1", tenant="acme")
        log.append(
            "anonymous",
            Action.AUTH_FAILED,
            resource="/cantata.v1.Jobs/Submit",
            outcome="denied",
            details={"reason": "no client certificate"},
            peer="ipv4:203.0.113.9:5555",
        )
        second_period = log.append(
            _tenant("globex"),
            Action.AUTHZ_DENIED,
            resource="/cantata.v1.Admin/Approve",
            tenant="globex",
            outcome="denied",
            details={"reason": "not an admin"},
            peer="ipv4:10.2.2.2:2",
        )
        log.append(_tenant("acme"), Action.JOB_SUBMITTED, resource="job-a2", tenant="acme")
        log.append(
            "spiffe://cantata/job/job-a2/worker/1",
            Action.GRADIENT_ANOMALY_DETECTED,
            resource="job-a2",
            tenant="acme",
            details={"peer_worker": 3, "norm_ratio": 41.5},
        )
        log.append(
            "spiffe://cantata/job/job-a2/worker/1",
            Action.PEER_QUARANTINED,
            resource="job-a2",
            tenant="acme",
            details={"peer_worker": 3},
        )
        log.append(_tenant("globex"), Action.JOB_SUBMITTED, resource="job-g1", tenant="globex")
    return directory, second_period


def test_report_leads_with_the_verdict_and_counts_everything(history):
    directory, _ = history
    report = build_report(directory)
    assert report.verification.ok and report.total == 12
    assert report.by_tenant == {"(platform)": 2, "acme": 6, "globex": 4}
    assert report.by_tenant_action["acme"][Action.JOB_SUBMITTED] == 2
    assert report.by_action[Action.JOB_SUBMITTED] == 3
    assert [r.action for r in report.refusals] == [Action.AUTH_FAILED, Action.AUTHZ_DENIED]
    assert [r.action for r in report.anomalies] == [Action.GRADIENT_ANOMALY_DETECTED, Action.PEER_QUARANTINED]
    assert [(r.tenant, r.actor) for r in report.approvals] == [("acme", ADMIN), ("globex", ADMIN)]
    assert sum(bucket.records for bucket in report.timeline) == 12
    assert sum(bucket.refusals for bucket in report.timeline) == 2
    text = render_report(report, "text")
    assert text.splitlines()[2].startswith("Verification: INTACT: 12/12 records valid")
    assert "ipv4:203.0.113.9:5555" in text and "no client certificate" in text


def test_tenant_report_holds_only_that_tenants_records(history):
    directory, _ = history
    report = build_report(directory, tenant="globex")
    assert report.total == 4 and set(report.by_tenant) == {"globex"}
    assert [r.action for r in report.refusals] == [Action.AUTHZ_DENIED]
    assert report.anomalies == ()
    rendered = render_report(report, "json")
    assert "acme" not in rendered and "203.0.113.9" not in rendered


def test_period_filter_splits_the_history(history):
    directory, boundary = history
    later = build_report(directory, since=boundary.time)
    earlier = build_report(directory, until=boundary.time)
    assert later.total + earlier.total == 12
    assert min(r.seq for r in later.refusals) == boundary.seq
    assert all(r.seq < boundary.seq for r in earlier.approvals) and len(earlier.approvals) == 2
    assert build_report(directory, since=boundary.time + timedelta(days=1)).total == 0


def test_json_report_round_trips_the_numbers(history):
    directory, _ = history
    document = json.loads(render_report(build_report(directory, tenant="acme"), "json"))
    assert document["verification"]["ok"] is True
    assert document["records"] == 6 and document["by_tenant"] == {"acme": 6}
    assert [r["action"] for r in document["anomalies"]] == ["gradient_anomaly_detected", "peer_quarantined"]
    assert document["approvals"][0]["actor"] == ADMIN


def test_markdown_report_has_tables(history):
    directory, _ = history
    markdown = render_report(build_report(directory), "markdown")
    assert "| tenant | records |" in markdown and "| acme | 6 |" in markdown
    assert "## Tenant approvals (2)" in markdown


def test_html_report_is_one_self_contained_file_with_a_chart(history):
    directory, _ = history
    page = render_report(build_report(directory), "html")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<svg") == 1 and "<rect" in page
    assert not re.search(r"https?://|<script|<link|<img|src=|@import|url\(", page)
    assert "INTACT: 12/12 records valid" in page


def test_report_on_a_broken_log_says_so_first(history, tmp_path):
    directory, _ = history
    broken = tmp_path / "audit"
    shutil.copytree(directory, broken)
    segment = sorted((broken / "segments").iterdir())[0]
    segment.write_bytes(segment.read_bytes().replace(b"job-a1", b"job-zz"))
    report = build_report(broken)
    for fmt in ("text", "markdown", "html"):
        assert "BROKEN at seq 6 (modified)" in render_report(report, fmt)
    assert json.loads(render_report(report, "json"))["verification"]["first_break"] == 6


def test_html_escapes_recorded_text(tmp_path):
    directory = tmp_path / "audit"
    init_audit(directory)
    with AuditLog.open(directory) as log:
        log.append("<script>alert(1)</script>", Action.AUTH_FAILED, outcome="denied")
    page = render_report(build_report(directory), "html")
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_unknown_format_is_refused(history):
    with pytest.raises(ValueError, match="unknown report format"):
        render_report(build_report(history[0]), "pdf")
