"""The tamper matrix: every kind of rewrite of a 10,000-record, multi-segment audit log is found and located."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cantata.security.audit import (
    Action,
    AuditKeyError,
    AuditLog,
    AuditLogCorrupt,
    AuditLogNotFound,
    BreakKind,
    Durability,
    init_audit,
    verify,
)
from cantata.security.audit.checkpoint import Checkpoint
from cantata.security.audit.keys import KeyDirectory
from cantata.security.audit.record import body_hash, canonical

RECORDS = 10_000
TENANTS = ("acme", "globex", "initech")


def _fill(directory: Path) -> None:
    init_audit(directory)
    with AuditLog.open(directory, segment_max_bytes=1 << 20, durability=Durability.AT_CHECKPOINT) as log:
        for i in range(RECORDS):
            tenant = TENANTS[i % 3]
            log.append(
                f"spiffe://cantata/tenant/{tenant}",
                Action.JOB_SUBMITTED,
                resource=f"job-{i:05d}",
                tenant=tenant,
                details={"workers": i % 8},
                peer="ipv4:127.0.0.1:5000",
            )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pristine") / "audit"
    _fill(directory)
    return directory


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> Path:
    """Another platform's log, built the same way (same segment boundaries, different log id and key)."""
    directory = tmp_path_factory.mktemp("foreign") / "audit"
    _fill(directory)
    return directory


@pytest.fixture
def log_dir(pristine, tmp_path) -> Path:
    copy = tmp_path / "audit"
    shutil.copytree(pristine, copy)
    return copy


def segments(directory: Path) -> list[Path]:
    return sorted((directory / "segments").glob("segment-*.jsonl"))


def read_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def locate(directory: Path, seq: int) -> tuple[Path, int]:
    """The segment file and line index holding record ``seq``."""
    for path in segments(directory):
        for index, line in enumerate(read_lines(path)):
            if json.loads(line)["seq"] == seq:
                return path, index
    raise LookupError(seq)


def first_seq(path: Path) -> int:
    return json.loads(read_lines(path)[0])["seq"]


def rehashed(stored: dict) -> bytes:
    """A record line an attacker recomputed the hash of."""
    body = {k: v for k, v in stored.items() if k != "hash"}
    return canonical({**body, "hash": body_hash(body)}) + b"\n"


def assert_break(directory: Path, seq: int, kind: BreakKind):
    result = verify(directory)
    assert not result.ok
    assert (result.first_break, result.kind) == (seq, kind), result.summary()
    return result


def test_pristine_log_spans_segments_and_verifies(pristine):
    assert len(segments(pristine)) >= 3
    result = verify(pristine)
    assert result.ok, result.summary()
    assert (result.records_valid, result.records_total) == (RECORDS, RECORDS)
    assert result.checkpoints_valid == result.checkpoints_total >= RECORDS // 1000 + 1
    assert "10000/10000 records valid" in result.summary()


def test_one_byte_changed_in_a_middle_record(log_dir):
    path, index = locate(log_dir, 5000)
    lines = read_lines(path)
    position = lines[index].index(b"job-04999") + len(b"job-0499")
    lines[index] = lines[index][:position] + b"8" + lines[index][position + 1 :]
    path.write_bytes(b"".join(lines))
    result = assert_break(log_dir, 5000, BreakKind.MODIFIED)
    assert (result.records_valid, result.records_total) == (RECORDS - 1, RECORDS)
    assert "Record 5000 INVALID: modified" in result.summary()


def test_changed_record_with_recomputed_hash_is_blamed_on_itself(log_dir):
    path, index = locate(log_dir, 5000)
    lines = read_lines(path)
    stored = json.loads(lines[index])
    stored["outcome"] = "denied"
    lines[index] = rehashed(stored)
    path.write_bytes(b"".join(lines))
    assert_break(log_dir, 5000, BreakKind.MODIFIED)


def test_byte_that_breaks_the_json_is_located(log_dir):
    path, index = locate(log_dir, 5000)
    lines = read_lines(path)
    lines[index] = b"x" + lines[index][1:]
    path.write_bytes(b"".join(lines))
    result = assert_break(log_dir, 5000, BreakKind.MODIFIED)
    assert "not JSON" in result.message


def test_one_record_deleted(log_dir):
    path, index = locate(log_dir, 5000)
    lines = read_lines(path)
    del lines[index]
    path.write_bytes(b"".join(lines))
    result = assert_break(log_dir, 5000, BreakKind.DELETED)
    assert (result.records_valid, result.records_total) == (RECORDS - 1, RECORDS)


def test_two_records_swapped(log_dir):
    path, index = locate(log_dir, 5000)
    lines = read_lines(path)
    lines[index], lines[index + 1] = lines[index + 1], lines[index]
    path.write_bytes(b"".join(lines))
    result = assert_break(log_dir, 5000, BreakKind.REORDERED)
    assert (result.records_valid, result.records_total) == (RECORDS - 2, RECORDS)


def test_forged_record_inserted_with_a_valid_link(log_dir):
    path, index = locate(log_dir, 5000)
    lines = read_lines(path)
    genuine = json.loads(lines[index])
    forged = {**genuine, "action": Action.TENANT_APPROVED.value, "actor": "spiffe://cantata/admin/mallory"}
    lines.insert(index, rehashed(forged))
    path.write_bytes(b"".join(lines))
    result = assert_break(log_dir, 5000, BreakKind.INSERTED)
    assert (result.records_valid, result.records_total) == (RECORDS, RECORDS + 1)


def test_old_record_replayed_into_the_middle(log_dir):
    source, source_index = locate(log_dir, 17)
    replay = read_lines(source)[source_index]
    path, index = locate(log_dir, 5000)
    lines = read_lines(path)
    lines.insert(index, replay)
    path.write_bytes(b"".join(lines))
    assert_break(log_dir, 5000, BreakKind.INSERTED)


@pytest.mark.parametrize("cut_inside_a_line", [False, True])
def test_tail_truncated_past_the_last_signed_checkpoint(log_dir, cut_inside_a_line):
    path, index = locate(log_dir, 9501)
    data = path.read_bytes()
    offset = len(b"".join(read_lines(path)[:index])) + (40 if cut_inside_a_line else 0)
    path.write_bytes(data[:offset])
    result = assert_break(log_dir, 9501, BreakKind.TRUNCATED)
    assert (result.records_valid, result.records_total) == (9500, RECORDS)
    with pytest.raises(AuditLogCorrupt, match="records were removed"):
        AuditLog.open(log_dir)


def test_last_segment_removed_is_truncation(log_dir):
    last = segments(log_dir)[-1]
    start = first_seq(last)
    last.unlink()
    assert_break(log_dir, start, BreakKind.TRUNCATED)


def test_segment_replaced_by_one_from_another_platform(log_dir, foreign):
    ours, theirs = segments(log_dir)[1], segments(foreign)[1]
    assert first_seq(ours) == first_seq(theirs)
    shutil.copyfile(theirs, ours)
    result = assert_break(log_dir, first_seq(ours), BreakKind.SPLICED)
    assert verify(foreign).log_id in result.message


def _rewrite_checkpoint(directory: Path, seq: int, *, keep_key_id: bool) -> None:
    path = directory / "checkpoints.jsonl"
    lines = path.read_bytes().splitlines()
    index = next(i for i, line in enumerate(lines) if json.loads(line)["seq"] == seq)
    original = Checkpoint.from_stored(json.loads(lines[index]))
    impostor = Ed25519PrivateKey.generate()
    forged = Checkpoint.sign(
        impostor,
        index=original.index,
        seq=original.seq,
        chain_hash=original.hash,
        time=original.time,
        log_id=original.log_id,
        prev=original.prev,
        within=original.within,
    )
    if keep_key_id:
        stored = json.loads(forged.to_line())
        stored["key"] = original.key_id
        lines[index] = canonical(stored)
    else:
        lines[index] = forged.to_line()
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_checkpoint_re_signed_with_an_unknown_key(log_dir):
    _rewrite_checkpoint(log_dir, 5000, keep_key_id=False)
    result = assert_break(log_dir, 5000, BreakKind.UNKNOWN_KEY)
    assert result.checkpoints_valid == result.checkpoints_total - 1


def test_checkpoint_re_signed_under_the_real_key_id(log_dir):
    _rewrite_checkpoint(log_dir, 5000, keep_key_id=True)
    assert_break(log_dir, 5000, BreakKind.BAD_SIGNATURE)


def test_segment_file_removed(log_dir):
    removed = segments(log_dir)[1]
    start, end = first_seq(removed), first_seq(segments(log_dir)[2])
    removed.unlink()
    result = assert_break(log_dir, start, BreakKind.MISSING_SEGMENT)
    assert (result.records_valid, result.records_total) == (RECORDS - (end - start), RECORDS)
    assert removed.name.removeprefix("segment-").removesuffix(".jsonl") in result.message


def test_segments_swapped_are_reordered(log_dir):
    second, third = segments(log_dir)[1:3]
    start = first_seq(second)
    swap = second.with_suffix(".swap")
    second.rename(swap)
    third.rename(second)
    swap.rename(third)
    assert_break(log_dir, start, BreakKind.REORDERED)


def test_history_rewritten_consistently_still_contradicts_the_signatures(log_dir):
    """An attacker without the key re-chains every record after 5500; the checkpoint at 6000 exposes it."""
    prev = None
    for path in segments(log_dir):
        lines = []
        for line in read_lines(path):
            stored = json.loads(line)
            if stored["seq"] == 5500:
                stored["actor"] = "spiffe://cantata/admin/mallory"
            if stored["seq"] >= 5500:
                if prev is not None and stored["seq"] > 5500:
                    stored["prev"] = prev
                line = rehashed(stored)
                prev = json.loads(line)["hash"]
            lines.append(line)
        path.write_bytes(b"".join(lines))
    assert_break(log_dir, 5001, BreakKind.REWRITTEN)


def test_checkpoint_line_deleted(log_dir):
    path = log_dir / "checkpoints.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    removed = json.loads(lines[5])
    del lines[5]
    path.write_bytes(b"".join(lines))
    result = verify(log_dir)
    assert result.kind == BreakKind.DELETED
    assert f"checkpoints #{removed['n']}..#{removed['n']}" in result.message


def test_trailing_checkpoints_removed(log_dir):
    """Dropping the last checkpoints leaves more unsigned records than the last one promised."""
    path = log_dir / "checkpoints.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[-3:]
    path.write_bytes(b"".join(lines))
    last = json.loads(lines[-1])
    result = assert_break(log_dir, last["seq"] + 1, BreakKind.DELETED)
    assert "later checkpoints were removed" in result.message


def test_empty_log_is_an_error(tmp_path):
    init_audit(tmp_path / "audit")
    result = verify(tmp_path / "audit")
    assert not result.ok and result.kind == BreakKind.EMPTY
    assert "holds no records" in result.message


def test_missing_log_is_an_error(tmp_path):
    with pytest.raises(AuditLogNotFound, match="no audit log"):
        verify(tmp_path / "nowhere")


def test_corrupt_identity_file_is_an_error(log_dir):
    (log_dir / "log.json").write_bytes(b"\x00garbage")
    with pytest.raises(AuditLogCorrupt, match=r"log.json is not a valid audit log identity"):
        verify(log_dir)


def test_garbage_segment_is_reported_at_its_first_record(log_dir):
    target = segments(log_dir)[1]
    start = first_seq(target)
    target.write_bytes(b"\x8f\x00 not a log \n" * 10)
    result = assert_break(log_dir, start, BreakKind.MODIFIED)
    assert "not JSON" in result.message


def test_corrupt_checkpoint_file_is_reported(log_dir):
    path = log_dir / "checkpoints.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"{broken\n"
    path.write_bytes(b"".join(lines))
    result = verify(log_dir)
    assert result.kind == BreakKind.CORRUPT
    assert "checkpoint line 4 is unreadable" in result.message


def test_missing_root_key_file_is_an_error(log_dir):
    root = json.loads((log_dir / "log.json").read_bytes())["root_key"]
    (log_dir / "keys" / f"{root}.pub").unlink()
    with pytest.raises(AuditKeyError, match=f"audit public key file missing: .*{root}.pub"):
        verify(log_dir)


def _rewrite_identity(directory: Path, **changes) -> None:
    path = directory / "log.json"
    identity = json.loads(path.read_bytes())
    path.write_bytes(canonical({**identity, **changes}) + b"\n")


@pytest.mark.parametrize(
    "changes",
    [
        {"created": "2020-01-01T00:00:00.000000Z"},  # an earlier creation time
        {"root_key": "0123456789abcdef"},  # another root key id
        {"note": "harmless?"},  # a field nothing signs
    ],
    ids=["created", "root_key", "extra_field"],
)
def test_a_changed_log_identity_fails_verification(log_dir, changes):
    keys = _public_keys(log_dir)  # held outside the log, so a changed root key id cannot pick the trust
    _rewrite_identity(log_dir, **changes)
    result = verify(log_dir, public_keys=keys)
    assert not result.ok and result.kind == BreakKind.MODIFIED, result.summary()
    assert "log.json" in result.findings[0].message


def test_a_respaced_log_identity_fails_verification(log_dir):
    path = log_dir / "log.json"
    path.write_bytes(json.dumps(json.loads(path.read_bytes()), indent=1).encode())
    result = verify(log_dir)
    assert not result.ok and "log.json" in result.summary()


def _public_keys(directory: Path) -> dict:
    keys = KeyDirectory(directory / "keys")
    return {p.stem: keys.public_key(p.stem) for p in (directory / "keys").glob("*.pub")}
