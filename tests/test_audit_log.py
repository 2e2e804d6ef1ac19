"""Appending to the audit log: records, secrets screening, durability, crash recovery, key rotation."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from cantata.security.audit import (
    Action,
    AuditKeyError,
    AuditLog,
    AuditLogBusy,
    AuditLogClosed,
    AuditLogExists,
    BreakKind,
    SecretMaterialError,
    init_audit,
    load_public_keys_file,
    read_records,
    verify,
)
from testkit.waiting import wait_for

ADMIN = "spiffe://cantata/admin/root"


@pytest.fixture
def audit_dir(tmp_path) -> Path:
    directory = tmp_path / "audit"
    init_audit(directory)
    return directory


def checkpoints(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "checkpoints.jsonl").read_bytes().splitlines()]


def test_init_creates_layout_and_refuses_to_overwrite(tmp_path):
    directory = tmp_path / "audit"
    key_id = init_audit(directory)
    assert (directory / "keys" / f"{key_id}.key").stat().st_mode & 0o777 == 0o600
    assert (directory / "keys" / "active").read_text().strip() == key_id
    assert json.loads((directory / "log.json").read_bytes())["root_key"] == key_id
    assert [c["seq"] for c in checkpoints(directory)] == [0]
    with pytest.raises(AuditLogExists):
        init_audit(directory)


def test_every_action_produces_a_readable_record(audit_dir):
    with AuditLog.open(audit_dir) as log:
        for action in Action:
            record = log.append(
                ADMIN,
                action,
                resource=f"res-{action}",
                tenant="acme",
                details={"step": 3, "reason": "test"},
                peer="ipv4:10.0.0.7:4242",
            )
            assert record.action == action.value
    stored = list(read_records(audit_dir))
    assert [r.action for r in stored] == [a.value for a in Action]
    assert [r.seq for r in stored] == list(range(1, len(Action) + 1))
    first = stored[0]
    assert (first.actor, first.tenant, first.resource, first.peer, first.outcome) == (
        ADMIN,
        "acme",
        f"res-{Action.TENANCY_REQUESTED}",
        "ipv4:10.0.0.7:4242",
        "ok",
    )
    assert first.time.tzinfo is not None and dict(first.details) == {"step": 3, "reason": "test"}
    assert verify(audit_dir).ok


@pytest.mark.parametrize(
    "details",
    [
        {"password": "hunter2"},
        {"client_secret": "s"},
        {"apiToken": "t"},
        {"data_key": "00ff"},
        {"tls": {"private_key": "x"}},
        {"note": "-----BEGIN PRIVATE KEY-----\nMC4CAQ...\n-----END PRIVATE KEY-----"},
        {"blob": b"\x01\x02"},
    ],
)
def test_secret_material_is_refused(audit_dir, details):
    with AuditLog.open(audit_dir) as log:
        with pytest.raises(SecretMaterialError):
            log.append(ADMIN, Action.KEY_UNWRAPPED, details=details)
        assert log.last_seq == 0


def test_references_to_keys_are_allowed(audit_dir):
    with AuditLog.open(audit_dir) as log:
        record = log.append(ADMIN, Action.KEY_UNWRAPPED, details={"key_id": "kek-1", "kek_fingerprint": "ab"})
    assert dict(record.details) == {"key_id": "kek-1", "kek_fingerprint": "ab"}


@pytest.mark.parametrize(
    "bad",
    [
        {"actor": ""},
        {"action": "Job Submitted"},
        {"outcome": ""},
        {"details": {"x": float("nan")}},
        {"details": {"x": object()}},
    ],
)
def test_malformed_appends_are_refused(audit_dir, bad):
    call = {"actor": ADMIN, "action": Action.JOB_SUBMITTED} | bad
    actor, action = call.pop("actor"), call.pop("action")
    with AuditLog.open(audit_dir) as log, pytest.raises(ValueError):
        log.append(actor, action, **call)


def test_concurrent_appends_form_one_chain(audit_dir):
    with AuditLog.open(audit_dir, checkpoint_every_records=50) as log:

        def worker(n: int) -> None:
            for i in range(100):
                log.append(f"spiffe://cantata/job/j/worker/{n}", Action.CHECKPOINT_WRITTEN, resource=f"{n}-{i}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    records = list(read_records(audit_dir))
    assert sorted(r.seq for r in records) == list(range(1, 601))
    assert len({r.resource for r in records}) == 600
    assert verify(audit_dir).ok


def test_checkpoints_every_n_records_and_at_close(audit_dir):
    with AuditLog.open(audit_dir, checkpoint_every_records=10) as log:
        for _ in range(25):
            log.append(ADMIN, Action.JOB_STARTED)
        assert [c["seq"] for c in checkpoints(audit_dir)] == [0, 0, 10, 20]
    assert [c["seq"] for c in checkpoints(audit_dir)] == [0, 0, 10, 20, 25]


def test_checkpoint_within_the_time_limit_without_further_appends(audit_dir):
    with AuditLog.open(audit_dir, checkpoint_every_seconds=0.2) as log:
        log.append(ADMIN, Action.SERVER_STARTED)
        wait_for(lambda: checkpoints(audit_dir)[-1]["seq"] == 1, interval=0.05)
        assert checkpoints(audit_dir)[-1]["seq"] == 1


def test_second_writer_and_closed_log_are_refused(audit_dir):
    log = AuditLog.open(audit_dir)
    with pytest.raises(AuditLogBusy):
        AuditLog.open(audit_dir)
    log.close()
    with pytest.raises(AuditLogClosed):
        log.append(ADMIN, Action.SERVER_STOPPED)
    AuditLog.open(audit_dir).close()


def test_reopening_continues_the_chain(audit_dir):
    for round_ in range(3):
        with AuditLog.open(audit_dir, segment_max_bytes=2048) as log:
            for _ in range(20):
                log.append(ADMIN, Action.QUOTA_CHANGED, details={"round": round_})
    result = verify(audit_dir)
    assert result.ok and result.records_total == 60 and result.segments > 3


def test_missing_signing_key_is_a_clear_error(audit_dir):
    active = (audit_dir / "keys" / "active").read_text().strip()
    (audit_dir / "keys" / f"{active}.key").unlink()
    with pytest.raises(AuditKeyError, match=f"audit signing key file missing: .*{active}.key"):
        AuditLog.open(audit_dir)


_CRASHING_WRITER = textwrap.dedent("""
    import os, sys
    from cantata.security.audit import Action, AuditLog
    log = AuditLog.open(sys.argv[1])
    for i in range(5):
        log.append("spiffe://cantata/admin/root", Action.JOB_SUBMITTED, resource=f"job-{i}")
    segment = sorted(os.listdir(os.path.join(sys.argv[1], "segments")))[-1]
    with open(os.path.join(sys.argv[1], "segments", segment), "ab") as f:
        f.write(b'{"action":"job_submitted","actor":"spiffe://cantata/ad')   # the power fails mid-write
    os._exit(9)
""")


def test_torn_last_record_after_a_crash_is_reported_then_recovered_on_the_record(audit_dir):
    crashed = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(audit_dir)], capture_output=True)
    assert crashed.returncode == 9, crashed.stderr.decode()

    result = verify(audit_dir)
    assert not result.ok
    assert (result.first_break, result.kind) == (6, BreakKind.TORN_RECORD)
    assert (result.records_valid, result.records_total) == (5, 6)

    with AuditLog.open(audit_dir) as log:
        log.append(ADMIN, Action.SERVER_STARTED)
    records = list(read_records(audit_dir))
    recovery = records[5]
    assert recovery.action == Action.AUDIT_LOG_RECOVERED
    evidence = audit_dir / recovery.details["quarantined_as"]
    assert evidence.read_bytes().startswith(b'{"action":"job_submitted"')
    assert recovery.details["length"] == evidence.stat().st_size
    assert [r.action for r in records[6:]] == [Action.SERVER_STARTED]
    assert verify(audit_dir).ok


def test_rotated_keys_keep_old_segments_verifiable(audit_dir, tmp_path):
    root = (audit_dir / "keys" / "active").read_text().strip()
    root_pem = tmp_path / "root.pem"
    root_pem.write_bytes((audit_dir / "keys" / f"{root}.pub").read_bytes())
    with AuditLog.open(audit_dir, segment_max_bytes=4096, checkpoint_every_records=7) as log:
        for _ in range(30):
            log.append(ADMIN, Action.JOB_SUBMITTED)
        second = log.rotate_key(actor=ADMIN)
        for _ in range(30):
            log.append(ADMIN, Action.JOB_FINISHED)
        third = log.rotate_key()
        log.append(ADMIN, Action.SERVER_STOPPED)
    assert len({root, second, third}) == 3
    assert sorted(p.name for p in (audit_dir / "keys").glob("*.key")) == [f"{third}.key"]
    signers = {c["key"] for c in checkpoints(audit_dir)}
    assert signers == {root, second, third}
    rotations = [r for r in read_records(audit_dir) if r.action == Action.AUDIT_KEY_ROTATED]
    assert [dict(r.details) for r in rotations] == [
        {"old_key_id": root, "new_key_id": second},
        {"old_key_id": second, "new_key_id": third},
    ]

    result = verify(audit_dir, public_keys=load_public_keys_file(root_pem))
    assert result.ok, result.summary()
    assert set(result.trusted_keys) == {root, second, third}

    only_latest = load_public_keys_file(audit_dir / "keys" / f"{third}.pub")
    distrusted = verify(audit_dir, public_keys=only_latest)
    assert (distrusted.first_break, distrusted.kind) == (0, BreakKind.UNKNOWN_KEY)


def test_hash_from_the_stored_line_equals_the_hash_of_the_body(audit_dir):
    from cantata.security.audit.record import body_hash, canonical_line_hash

    with AuditLog.open(audit_dir) as log:
        record = log.append(
            ADMIN,
            Action.CHECKPOINT_WRITTEN,
            resource='a,"hash":"x"',
            details={"hash": "0" * 64, "nested": {"hash": "y"}},
        )
    line = record.to_line().rstrip(b"\n")
    assert canonical_line_hash(line, record.hash) == body_hash(record.body()) == record.hash
    assert verify(audit_dir).ok


def test_torn_checkpoint_after_a_crash_is_reported_then_quarantined(audit_dir):
    with AuditLog.open(audit_dir) as log:
        log.append(ADMIN, Action.SERVER_STARTED)
    with (audit_dir / "checkpoints.jsonl").open("ab") as checkpoint_file:
        checkpoint_file.write(b'{"hash":"00')
    result = verify(audit_dir)
    assert result.kind == BreakKind.TORN_RECORD and result.first_break is None
    assert "incomplete checkpoint" in result.message
    AuditLog.open(audit_dir).close()
    recovery = [r for r in read_records(audit_dir) if r.action == Action.AUDIT_LOG_RECOVERED]
    assert [r.details["file"] for r in recovery] == ["checkpoints.jsonl"]
    assert verify(audit_dir).ok


def test_whitespace_added_to_a_record_is_a_modification(audit_dir):
    with AuditLog.open(audit_dir) as log:
        for _ in range(3):
            log.append(ADMIN, Action.JOB_STARTED)
    segment = audit_dir / "segments" / "segment-00000001.jsonl"
    lines = segment.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"actor":', b'"actor": ', 1)
    segment.write_bytes(b"".join(lines))
    result = verify(audit_dir)
    assert (result.first_break, result.kind) == (2, BreakKind.MODIFIED)
    assert "not in canonical form" in result.message
