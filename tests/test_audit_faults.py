"""The audit log fails closed: a write a full disk refuses leaves it as it was, and opening proves the unsigned tail."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cantata.security.audit import (
    Action,
    AuditEntry,
    AuditLog,
    AuditLogCorrupt,
    AuditLogUnavailable,
    init_audit,
    read_records,
    verify,
)
from tests.fullfs import fill, small_tmpfs

ADMIN = "spiffe://cantata/admin/root"
SEGMENT = Path("segments") / "segment-00000001.jsonl"


def test_a_write_the_full_disk_refuses_leaves_the_log_as_it_was_and_the_next_one_succeeds(tmp_path):
    with small_tmpfs(tmp_path / "audit") as directory:
        init_audit(directory)
        log = AuditLog.open(directory)
        try:
            for i in range(3):
                log.append(ADMIN, Action.JOB_SUBMITTED, resource=f"job-{i}")
            segment, checkpoints = directory / SEGMENT, directory / "checkpoints.jsonl"
            filler = fill(directory)
            signed = 0
            while True:  # checkpoints fill what room the file's last page still has, then one fails
                before = segment.read_bytes(), checkpoints.read_bytes()
                try:
                    log.checkpoint()
                except AuditLogUnavailable as refused:
                    assert "No space left on device" in str(refused)
                    break
                signed += 1
                assert signed < 64, "a full tmpfs kept taking checkpoints"

            # Larger than a page, so it outgrows whatever room the segment's last page has: a short write.
            with pytest.raises(AuditLogUnavailable, match="cannot be written: No space left on device"):
                log.append(ADMIN, Action.JOB_SUBMITTED, resource="job-lost", details={"note": "x" * 6000})
            assert (segment.read_bytes(), checkpoints.read_bytes()) == before
            assert "No space left on device" in (log.failure or "")
            assert log.probe() is not None  # still full: the probe's checkpoint fails and leaves nothing
            assert checkpoints.read_bytes() == before[1]
            assert verify(directory).ok

            filler.unlink()
            assert log.probe() is None  # space is back: noticed without an append
            record = log.append(ADMIN, Action.JOB_SUBMITTED, resource="job-after")
            assert record.seq == 4 and log.failure is None
        finally:
            log.close()
        result = verify(directory)
        assert result.ok, result.summary()
        assert [r.resource for r in read_records(directory)] == ["job-0", "job-1", "job-2", "job-after"]
        AuditLog.open(directory).close()  # and it opens again, its tail proven


def test_records_appended_together_are_all_written_or_none(tmp_path):
    with small_tmpfs(tmp_path / "audit") as directory:
        init_audit(directory)
        log = AuditLog.open(directory)
        try:
            together = [
                AuditEntry(ADMIN, action, resource="acme", tenant="acme")
                for action in (Action.TENANT_APPROVED, Action.KEY_CREATED, Action.CERTIFICATE_ISSUED)
            ]
            records = log.append_all(together)
            assert [r.seq for r in records] == [1, 2, 3] and records[1].prev == records[0].hash
            segment = directory / SEGMENT
            filler = fill(directory)
            before = segment.read_bytes()
            # Each record alone would fit what room the segment's last page has; the three together do not.
            big = [
                AuditEntry(ADMIN, Action.JOB_SUBMITTED, resource=f"job-{i}", details={"note": "x" * 1800})
                for i in range(3)
            ]
            with pytest.raises(AuditLogUnavailable, match="No space left on device"):
                log.append_all(big)
            assert segment.read_bytes() == before
            filler.unlink()
            assert [r.seq for r in log.append_all(big)] == [4, 5, 6]
        finally:
            log.close()
        result = verify(directory)
        assert result.ok, result.summary()
        assert [r.action for r in read_records(directory)][:3] == [
            "tenant_approved",
            "key_created",
            "certificate_issued",
        ]


_CRASHING_WRITER = textwrap.dedent("""
    import os, sys
    from cantata.security.audit import Action, AuditLog
    log = AuditLog.open(sys.argv[1])
    for i in range(6):
        log.append("spiffe://cantata/admin/root", Action.JOB_SUBMITTED, resource=f"job-{i}")
    os._exit(9)   # a crash: the six records are durable, no checkpoint signs them
""")


@pytest.fixture
def crashed_log(tmp_path) -> Path:
    """A log whose writer died after six records the last checkpoint does not cover."""
    directory = tmp_path / "audit"
    init_audit(directory)
    with AuditLog.open(directory) as log:
        log.append(ADMIN, Action.SERVER_STARTED)  # signed at close: record 1 is before the last checkpoint
    crashed = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(directory)], capture_output=True)
    assert crashed.returncode == 9, crashed.stderr.decode()
    return directory


def _lines(directory: Path) -> list[bytes]:
    return (directory / SEGMENT).read_bytes().splitlines(keepends=True)


def _modify(directory: Path) -> None:
    lines = _lines(directory)
    record = json.loads(lines[3])
    record["resource"] = "job-forged"
    lines[3] = json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    (directory / SEGMENT).write_bytes(b"".join(lines))


def _torn_then_appended(directory: Path) -> None:
    """What a full disk did before: half a record, and the next record written right after it."""
    lines = _lines(directory)
    lines[3] = lines[3][: len(lines[3]) // 2]
    (directory / SEGMENT).write_bytes(b"".join(lines))


def _delete(directory: Path) -> None:
    lines = _lines(directory)
    del lines[3]
    (directory / SEGMENT).write_bytes(b"".join(lines))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_modify, "record 4 does not match its hash"),
        (_torn_then_appended, "line 4: not an audit record"),
        (_delete, "record 5 does not follow record 3"),
    ],
    ids=["modified", "torn-then-appended", "deleted"],
)
def test_damage_after_the_last_checkpoint_refuses_the_open(crashed_log, damage, message):
    damage(crashed_log)
    before = _lines(crashed_log)
    with pytest.raises(AuditLogCorrupt, match=message):
        AuditLog.open(crashed_log)
    assert _lines(crashed_log) == before  # nothing repaired or quarantined on a refusal
    assert not verify(crashed_log).ok


def test_a_torn_last_record_after_unsigned_ones_is_quarantined_and_the_rest_kept(crashed_log):
    segment = crashed_log / SEGMENT
    segment.write_bytes(segment.read_bytes() + b'{"action":"job_sub')
    with AuditLog.open(crashed_log) as log:
        assert log.last_seq == 8  # seven records and the recovery record
    records = list(read_records(crashed_log))
    assert [r.action for r in records[-1:]] == [Action.AUDIT_LOG_RECOVERED]
    assert verify(crashed_log).ok


def test_a_record_that_differs_from_what_the_checkpoint_signed_refuses_the_open(tmp_path):
    directory = tmp_path / "audit"
    init_audit(directory)
    with AuditLog.open(directory) as log:
        for i in range(3):
            log.append(ADMIN, Action.JOB_SUBMITTED, resource=f"job-{i}")
    _modify_last_consistently(directory)
    with pytest.raises(AuditLogCorrupt, match="record 3 differs from what the last checkpoint signed"):
        AuditLog.open(directory)


def _modify_last_consistently(directory: Path) -> None:
    """Rewrite the last record with a hash that matches its new content (only the checkpoint can tell)."""
    from cantata.security.audit.record import body_hash, canonical

    lines = _lines(directory)
    record = json.loads(lines[-1])
    record["resource"] = "job-forged"
    record.pop("hash")
    record["hash"] = body_hash(record)
    lines[-1] = canonical(record) + b"\n"
    (directory / SEGMENT).write_bytes(b"".join(lines))
