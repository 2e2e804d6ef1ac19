"""``find_records``: the audit lookup's filters, pages that skip whole segments, and lines that only look alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cantata.security.audit import AuditEntry, AuditLog, find_records, init_audit, read_records, verify
from cantata.security.audit.layout import AuditLayout


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A log of 300 records over several small segments: three tenants, two actions, request ids."""
    directory = tmp_path / "audit"
    init_audit(directory)
    with AuditLog.open(directory, segment_max_bytes=4096) as log:
        for i in range(300):
            tenant = ("acme", "globex", "")[i % 3]
            details: dict[str, object] = {"request_id": f"req-{i:04d}"}
            if i == 6:  # acme's record, with a value that holds another record's filter text, byte for byte
                details["copied_from"] = {
                    "tenant": "globex",
                    "request_id": "req-0006",
                }  # '"tenant":"globex"' in its line
            log.append(
                f"spiffe://cantata/tenant/{tenant or 'x'}",
                "job_deleted" if i % 10 == 0 else "job_submitted",
                resource=f"job-{i}",
                tenant=tenant,
                details=details,
            )
    assert len(AuditLayout(directory).segments()) > 3
    return directory


def test_filters_match_exactly_what_a_full_scan_finds(log_dir):
    everything = list(read_records(log_dir))
    for query in (
        {"tenant": "globex"},
        {"tenant": "acme", "action": "job_deleted"},
        {"action": "job_deleted"},
        {"request_id": "req-0123"},
        {"tenant": "globex", "request_id": "req-0006"},  # 6 is acme's: its note only looks like a match
    ):
        expected = [
            r
            for r in everything
            if (("tenant" not in query) or r.tenant == query["tenant"])
            and (("action" not in query) or r.action == query["action"])
            and (("request_id" not in query) or r.details["request_id"] == query["request_id"])
        ]
        assert [r.seq for r in find_records(log_dir, **query)] == [r.seq for r in expected], query
    assert [r.resource for r in find_records(log_dir, request_id="req-0123")] == ["job-123"]
    assert list(find_records(log_dir, tenant="globex", request_id="req-0006")) == []


def test_pages_resume_after_a_sequence_number_across_segments(log_dir):
    pages, after = [], 0
    while page := list(find_records(log_dir, tenant="acme", after=after, limit=17)):
        pages.append([r.seq for r in page])
        after = page[-1].seq
    assert [seq for page in pages for seq in page] == [r.seq for r in read_records(log_dir, tenant="acme")]
    assert all(len(page) == 17 for page in pages[:-1])
    assert [r.seq for r in find_records(log_dir, after=295)] == [296, 297, 298, 299, 300]


def test_time_bounds_and_a_torn_tail(log_dir):
    records = list(read_records(log_dir))
    middle = records[150].time
    assert [r.seq for r in find_records(log_dir, since=middle)] == [r.seq for r in records if r.time >= middle]
    assert [r.seq for r in find_records(log_dir, until=middle)] == [r.seq for r in records if r.time < middle]
    later = datetime.now(UTC) + timedelta(days=1)
    assert list(find_records(log_dir, since=later)) == []
    last = AuditLayout(log_dir).segments()[-1][1]
    with last.open("ab") as segment:  # a crash mid-append: the lookup skips it, verify reports it
        segment.write(b'{"seq":301,"tenant":"acme","act')
    assert [r.seq for r in find_records(log_dir, tenant="acme")][-1] == 298
    assert not verify(log_dir).ok


def test_entries_are_appended_in_order(log_dir):
    """The fixture's log itself verifies: the lookup reads what the writer wrote."""
    assert verify(log_dir).ok
    with AuditLog.open(log_dir) as log:
        log.append_all([AuditEntry("server", "server_started")])
    assert [r.action for r in find_records(log_dir, after=300)] == ["server_started"]
