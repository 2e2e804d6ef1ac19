"""Proving an audit log intact, or saying exactly where and how it breaks.

The verifier walks the checkpoints (trust: the root key, or the keys the
caller supplies, plus every key a trusted rotation checkpoint names), then
every record in log order, checking each record's own hash, its log id, its
sequence number, its link to the record before it, and, where a valid
checkpoint signed that sequence number, the chain hash. The first break is
located at a *position*: the first sequence number whose slot no longer holds
the record the chain promises. After a break the walk resynchronises, so the
counts describe the whole log, like ``aws cloudtrail validate-logs``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .checkpoint import FIRST_PREV, Checkpoint, line_hash
from .errors import AuditLogCorrupt
from .keys import key_id
from .layout import AuditLayout, LogIdentity
from .record import body_hash, canonical, canonical_line_hash, genesis_hash, parse_time
from .segments import LogLine, iter_lines, read_file, split_lines

LOOKAHEAD = 256
MAX_LISTED_FINDINGS = 20


class BreakKind(StrEnum):
    """How a log fails verification."""

    MODIFIED = "modified"  # a record's bytes changed
    DELETED = "deleted"  # records missing from the middle
    MISSING_SEGMENT = "missing_segment"  # a whole segment file removed
    INSERTED = "inserted"  # a record that the chain does not hold
    REORDERED = "reordered"  # records present but out of order
    TRUNCATED = "truncated"  # records a signed checkpoint covers are gone from the end
    SPLICED = "spliced"  # records or checkpoints from another log
    REWRITTEN = "rewritten"  # a consistent chain that differs from what was signed
    UNKNOWN_KEY = "unknown_key"  # a checkpoint signed by a key nobody trusted
    BAD_SIGNATURE = "bad_signature"  # a checkpoint whose signature does not verify
    TORN_RECORD = "torn_record"  # an incomplete last write, left by a crash
    CORRUPT = "corrupt"  # a checkpoint line that cannot be read
    EMPTY = "empty"  # no records at all


@dataclass(frozen=True)
class Finding:
    """One break: where (a sequence number, when one applies), what kind, and the evidence."""

    seq: int | None
    kind: BreakKind
    message: str


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one audit log."""

    directory: Path
    log_id: str
    records_valid: int
    records_total: int
    checkpoints_valid: int
    checkpoints_total: int
    findings: tuple[Finding, ...]
    unsigned_records: int = 0
    segments: int = 0
    first_time: datetime | None = None
    last_time: datetime | None = None
    trusted_keys: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first_break(self) -> int | None:
        """Sequence number of the first broken position (``None`` when intact or not tied to a record)."""
        return self.findings[0].seq if self.findings else None

    @property
    def kind(self) -> BreakKind | None:
        return self.findings[0].kind if self.findings else None

    @property
    def message(self) -> str:
        """One line: the verdict, or the first break."""
        if self.ok:
            return (
                f"audit log intact: {self.records_valid}/{self.records_total} records valid, "
                f"{self.checkpoints_valid}/{self.checkpoints_total} checkpoints valid"
            )
        first = self.findings[0]
        where = f"at seq {first.seq}" if first.seq is not None else "in the checkpoints"
        return f"audit log broken {where}: {first.kind} - {first.message}"

    def summary(self) -> str:
        """A CloudTrail-like report: period, counts, and each invalid item."""
        period = (
            f"{self.first_time:%Y-%m-%dT%H:%M:%SZ} to {self.last_time:%Y-%m-%dT%H:%M:%SZ}"
            if self.first_time and self.last_time
            else "no records"
        )
        lines = [
            f"Validating audit log {self.directory} (log {self.log_id})",
            f"Results found for {period}:",
            "",
            f"{self.records_valid}/{self.records_total} records valid",
            f"{self.checkpoints_valid}/{self.checkpoints_total} checkpoints valid",
            f"{self.segments} segment files; signing keys trusted: {', '.join(self.trusted_keys) or 'none'}",
        ]
        if self.unsigned_records:
            lines.append(f"{self.unsigned_records} records after the last checkpoint are chained but not yet signed")
        for finding in self.findings[:MAX_LISTED_FINDINGS]:
            where = f"Record {finding.seq}" if finding.seq is not None else "Checkpoints"
            lines.append(f"{where} INVALID: {finding.kind}: {finding.message}")
        if len(self.findings) > MAX_LISTED_FINDINGS:
            lines.append(f"... and {len(self.findings) - MAX_LISTED_FINDINGS} more findings")
        lines.append("")
        lines.append(
            "Verdict: INTACT"
            if self.ok
            else f"Verdict: BROKEN - first break at "
            f"{'seq ' + str(self.first_break) if self.first_break is not None else 'the checkpoints'} "
            f"({self.kind})"
        )
        return "\n".join(lines)


@dataclass(slots=True)
class _Entry:
    """A segment line reduced to what the walk checks."""

    line: LogLine
    problem: str | None = None
    seq: int = -1
    prev: str = ""
    hash: str = ""
    stored_hash: str = ""
    log_id: str = ""
    time: str = ""


def _entry(line: LogLine) -> _Entry:
    if line.stored is None:
        return _Entry(line, problem=line.error)
    stored = line.stored
    seq, prev, stored_hash, log_id, moment = (stored.get(name) for name in ("seq", "prev", "hash", "log", "time"))
    if not (
        isinstance(seq, int)
        and not isinstance(seq, bool)
        and isinstance(prev, str)
        and isinstance(stored_hash, str)
        and isinstance(log_id, str)
        and isinstance(moment, str)
    ):
        return _Entry(line, problem="not an audit record (fields missing or mistyped)")
    # The hash of the line's own bytes, without re-encoding it: the writer's (canonical) lines match it, and
    # bytes that match it are the ones the chain and the checkpoints vouch for. Only a mismatch is re-encoded,
    # to tell a line out of canonical form (whitespace added by hand) from changed content.
    computed, problem = canonical_line_hash(line.raw, stored_hash), None
    if computed != stored_hash and canonical(stored) != line.raw:
        computed, problem = body_hash({k: v for k, v in stored.items() if k != "hash"}), "line is not in canonical form"
    if computed != stored_hash:
        problem = "content does not match its hash"
    return _Entry(line, problem, seq, prev, computed, stored_hash, log_id, moment)


class _Lookahead:
    """An iterator of entries that can peek ahead."""

    def __init__(self, entries: Iterator[_Entry]):
        self._entries = entries
        self._buffer: deque[_Entry] = deque()

    def __iter__(self) -> _Lookahead:
        return self

    def __next__(self) -> _Entry:
        return self._buffer.popleft() if self._buffer else next(self._entries)

    def peek(self, index: int) -> _Entry | None:
        while len(self._buffer) <= index:
            try:
                self._buffer.append(next(self._entries))
            except StopIteration:
                return None
        return self._buffer[index]


@dataclass
class _CheckpointScan:
    valid: list[Checkpoint]
    total: int
    findings: list[Finding]
    trusted: dict[str, Ed25519PublicKey]
    lines: dict[int, bytes] = field(default_factory=dict)
    anchored: list[Checkpoint] = field(default_factory=list)


def _scan_checkpoints(
    layout: AuditLayout, identity: LogIdentity, roots: Mapping[str, Ed25519PublicKey]
) -> _CheckpointScan:
    trusted = dict(roots)
    scan = _CheckpointScan([], 0, [], trusted)
    path = layout.checkpoints_path
    if not path.exists():
        scan.findings.append(Finding(None, BreakKind.CORRUPT, f"{path.name} is missing"))
        return scan
    if path.stat().st_size == 0:
        scan.findings.append(
            Finding(None, BreakKind.CORRUPT, f"{path.name} is empty: even the genesis checkpoint is gone")
        )
        return scan
    expected_prev: str | None
    expected_index, expected_prev, covered = 0, FIRST_PREV, 0
    for line in split_lines(0, read_file(path), final=True):
        scan.total += 1
        at = f"checkpoint line {line.line_no}"
        if line.torn:
            scan.findings.append(
                Finding(
                    None,
                    BreakKind.TORN_RECORD,
                    f"{path.name} ends with an incomplete checkpoint (a crash interrupted its write)",
                )
            )
            continue
        try:
            if line.stored is None:
                raise AuditLogCorrupt(line.error or "unreadable")
            checkpoint = Checkpoint.from_stored(line.stored)
            if checkpoint.to_line() != line.raw:
                raise AuditLogCorrupt("line is not in canonical form")
        except AuditLogCorrupt as exc:
            scan.findings.append(Finding(covered + 1, BreakKind.CORRUPT, f"{at} is unreadable: {exc}"))
            expected_index, expected_prev = expected_index + 1, None
            continue
        scan.lines[checkpoint.index] = line.raw
        problem = _checkpoint_problem(checkpoint, identity, trusted, expected_index, expected_prev, covered)
        expected_index, expected_prev = checkpoint.index + 1, line_hash(line.raw)
        if problem is not None:
            scan.findings.append(Finding(problem[0], problem[1], f"{at} (#{checkpoint.index}): {problem[2]}"))
            expected_prev = None
            continue
        scan.valid.append(checkpoint)
        covered = checkpoint.seq
        if checkpoint.next_key is not None:
            trusted[key_id(checkpoint.next_key)] = checkpoint.next_key
    return scan


def _check_anchor(anchored: Iterable[bytes], scan: _CheckpointScan, identity: LogIdentity) -> None:
    """Hold the local checkpoints against their external copies; valid copies become evidence too."""
    for raw in anchored:
        try:
            checkpoint = Checkpoint.from_stored(json.loads(raw))
        except (ValueError, AuditLogCorrupt) as exc:
            scan.findings.append(Finding(None, BreakKind.CORRUPT, f"an anchored checkpoint is unreadable: {exc}"))
            continue
        label = f"anchored checkpoint #{checkpoint.index}"
        public_key = scan.trusted.get(checkpoint.key_id)
        if public_key is None or not checkpoint.signature_valid(public_key) or checkpoint.log_id != identity.log_id:
            scan.findings.append(
                Finding(
                    checkpoint.seq, BreakKind.BAD_SIGNATURE, f"{label} does not verify with a trusted key of this log"
                )
            )
            continue
        local = scan.lines.get(checkpoint.index)
        if local == checkpoint.to_line():
            continue
        if local is None:
            scan.findings.append(
                Finding(
                    checkpoint.seq,
                    BreakKind.DELETED,
                    f"{label} (seq {checkpoint.seq}) is missing from checkpoints.jsonl",
                )
            )
        else:
            scan.findings.append(
                Finding(
                    checkpoint.seq, BreakKind.MODIFIED, f"checkpoint #{checkpoint.index} differs from its anchored copy"
                )
            )
        scan.anchored.append(checkpoint)


def _identity_problems(layout: AuditLayout, identity: LogIdentity, valid: list[Checkpoint]) -> list[Finding]:
    """``log.json`` against the signed genesis checkpoint, which states its every field (log id, root key, time).

    So the identity needs no signature of its own: a changed byte of it either
    no longer matches what checkpoint 0 signed, or is not in canonical form.
    """
    name = layout.identity_path.name
    if layout.identity_path.read_bytes() != identity.to_bytes():
        return [Finding(None, BreakKind.MODIFIED, f"{name} is not in canonical form (changed by hand?)")]
    genesis = next((checkpoint for checkpoint in valid if checkpoint.index == 0), None)
    if genesis is None:
        return []  # the checkpoint scan already reports a missing or invalid genesis checkpoint
    if (genesis.time, genesis.key_id) != (identity.created, identity.root_key_id):
        return [
            Finding(
                None,
                BreakKind.MODIFIED,
                f"{name} states root key {identity.root_key_id} created {identity.created.isoformat()}, but the "
                f"signed genesis checkpoint states key {genesis.key_id} at {genesis.time.isoformat()}",
            )
        ]
    return []


def _checkpoint_problem(
    checkpoint: Checkpoint,
    identity: LogIdentity,
    trusted: Mapping[str, Ed25519PublicKey],
    expected_index: int,
    expected_prev: str | None,
    covered: int,
) -> tuple[int, BreakKind, str] | None:
    seq = checkpoint.seq
    if checkpoint.key_id not in trusted:
        return seq, BreakKind.UNKNOWN_KEY, f"signed with key {checkpoint.key_id}, which no trusted key vouches for"
    if not checkpoint.signature_valid(trusted[checkpoint.key_id]):
        return seq, BreakKind.BAD_SIGNATURE, f"signature does not verify with key {checkpoint.key_id}"
    if checkpoint.log_id != identity.log_id:
        return seq, BreakKind.SPLICED, f"belongs to log {checkpoint.log_id}, not {identity.log_id}"
    if checkpoint.index > expected_index:
        return (covered + 1, BreakKind.DELETED, f"checkpoints #{expected_index}..#{checkpoint.index - 1} are missing")
    if checkpoint.index < expected_index or seq < covered:
        return seq, BreakKind.REORDERED, f"expected checkpoint #{expected_index} after seq {covered}"
    if expected_prev is not None and checkpoint.prev != expected_prev:
        return covered, BreakKind.MODIFIED, f"does not link to the checkpoint before it (#{expected_index - 1})"
    if checkpoint.index == 0 and (seq != 0 or checkpoint.hash != genesis_hash(identity.log_id)):
        return 0, BreakKind.SPLICED, "the genesis checkpoint does not state this log's genesis hash"
    return None


class _ChainWalk:
    """Walks records in log order, classifying the first deviation at each break and resynchronising."""

    def __init__(self, identity: LogIdentity, signed: Mapping[int, str], segment_starts: Mapping[int, int]):
        self.log_id = identity.log_id
        self.signed = signed
        self.segment_starts = segment_starts
        self.findings: list[Finding] = []
        self.expected = 1
        self.links: set[str] | None = {genesis_hash(identity.log_id)}
        self.last: _Entry | None = None
        self.last_segment = 0
        self.invalid: set[int] = set()
        self.missing = 0
        self.extra = 0
        self.pending: dict[int, _Entry] = {}
        self.awaited: int | None = None
        self.in_splice = False
        self.torn: _Entry | None = None
        self.matched_checkpoint = 0
        self.rewrites: dict[int, Finding] = {}
        self.first_time: str | None = None
        self.last_time: str | None = None

    def run(self, entries: _Lookahead) -> None:
        for entry in entries:
            self._visit(entry, entries)
        for seq in sorted(self.pending):
            self._take(self.pending.pop(seq))
        self.findings.extend(self.rewrites.values())

    def _find(self, seq: int, kind: BreakKind, message: str) -> None:
        self.findings.append(Finding(seq, kind, message))

    def _visit(self, entry: _Entry, ahead: _Lookahead) -> None:
        where = entry.line.where
        if entry.problem is not None:
            if entry.line.torn:
                self.torn = entry
                return
            self._find(self.expected, BreakKind.MODIFIED, f"{where}: {entry.problem}")
            self.invalid.add(self.expected)
            self.links = {h for h in (entry.stored_hash, entry.hash) if h} or None
            self.expected += 1
            return
        if entry.log_id != self.log_id:
            if not self.in_splice:
                self._find(self.expected, BreakKind.SPLICED, f"{where}: record from another log ({entry.log_id})")
            self.in_splice = True
            self.invalid.add(self.expected)
            self.expected, self.links = self.expected + 1, None
            return
        self.in_splice = False
        seq = entry.seq
        if seq == self.expected:
            self._visit_expected(entry, ahead)
        elif seq > self.expected:
            self._visit_ahead(entry, ahead)
        else:
            self._visit_behind(entry)

    def _visit_expected(self, entry: _Entry, ahead: _Lookahead) -> None:
        seq, following = entry.seq, ahead.peek(0)
        if following is not None and following.problem is None and following.seq == seq:
            after = ahead.peek(1)
            if after is None or after.prev != entry.hash:
                self._find(
                    seq,
                    BreakKind.INSERTED,
                    f"{entry.line.where}: a second record claims seq {seq} and the chain continues from the other",
                )
                self.extra += 1
                return
        if self.links is not None and entry.prev not in self.links:
            self._find(
                seq - 1,
                BreakKind.MODIFIED,
                f"record {seq - 1} was altered: record {seq} ({entry.line.where}) no longer links to it",
            )
            self.invalid.add(seq - 1)
            self.rewrites.pop(seq - 1, None)
        self._accept(entry)

    def _visit_ahead(self, entry: _Entry, ahead: _Lookahead) -> None:
        seq, expected, where = entry.seq, self.expected, entry.line.where
        if self.awaited == expected or self._appears_later(expected, entry, ahead):
            if self.awaited != expected:
                self._find(expected, BreakKind.REORDERED, f"{where}: record {seq} stands where {expected} belongs")
            self.awaited = expected
            self.pending[seq] = entry
            self.invalid.add(seq)
            return
        gap = f"records {expected}..{seq - 1}" if seq - 1 > expected else f"record {expected}"
        if entry.line.segment > self.last_segment + 1 and entry.line.line_no == 1:
            absent = ", ".join(f"{n:08d}" for n in range(self.last_segment + 1, entry.line.segment))
            self._find(expected, BreakKind.MISSING_SEGMENT, f"segment file(s) {absent} missing: {gap} absent")
        else:
            self._find(expected, BreakKind.DELETED, f"{gap} missing before {where}")
        self.missing += seq - expected
        self._accept(entry)

    def _visit_behind(self, entry: _Entry) -> None:
        seq, where = entry.seq, entry.line.where
        if self.last is not None and seq == self.last.seq:
            self._find(seq, BreakKind.INSERTED, f"{where}: a second record claims seq {seq}")
        else:
            self._find(
                self.expected,
                BreakKind.INSERTED,
                f"{where}: a record claiming seq {seq} appears after seq {self.expected - 1}",
            )
        self.extra += 1

    def _appears_later(self, seq: int, entry: _Entry, ahead: _Lookahead) -> bool:
        for index in range(LOOKAHEAD):
            later = ahead.peek(index)
            if later is None:
                break
            if later.problem is None and later.seq == seq and later.log_id == self.log_id:
                return True
        return entry.line.line_no == 1 and any(
            number > entry.line.segment and start == seq for number, start in self.segment_starts.items()
        )

    def _accept(self, entry: _Entry) -> None:
        if self.pending:
            self.invalid.add(entry.seq)
        self._take(entry)
        while self.expected in self.pending:
            self._take(self.pending.pop(self.expected))
        if not self.pending:
            self.awaited = None

    def _take(self, entry: _Entry) -> None:
        signed = self.signed.get(entry.seq)
        if signed is not None:
            if signed == entry.hash:
                self.matched_checkpoint = entry.seq
            else:
                # Unless the next record exposes this one as the altered record, the whole
                # stretch since the last matching checkpoint is suspect.
                self.rewrites[entry.seq] = Finding(
                    self.matched_checkpoint + 1,
                    BreakKind.REWRITTEN,
                    f"the chain at record {entry.seq} differs from the signed checkpoint: records "
                    f"{self.matched_checkpoint + 1}..{entry.seq} were rewritten",
                )
                self.invalid.add(entry.seq)
        self.expected, self.links, self.last = entry.seq + 1, {entry.hash}, entry
        self.last_segment = entry.line.segment
        self.first_time = self.first_time or entry.time
        self.last_time = entry.time


def _segment_starts(layout: AuditLayout) -> dict[int, int]:
    """The sequence number each segment file's first line claims (for spotting reordered segments)."""
    starts = {}
    for number, path in layout.segments():
        with path.open("rb") as segment:
            first = segment.readline()
        for line in split_lines(number, first, final=False):
            entry = _entry(line)
            if entry.problem is None:
                starts[number] = entry.seq
    return starts


def verify(
    directory: Path, *, public_keys: Mapping[str, Ed25519PublicKey] | None = None, anchored: Iterable[bytes] = ()
) -> VerifyResult:
    """Verify the audit log in ``directory``.

    ``public_keys`` are the keys to trust (an externally held copy, the
    real trust anchor; ids are recomputed from the keys); by default the root
    key named by ``log.json`` is read from ``keys/``. ``anchored`` are
    checkpoint lines kept outside the server (see :func:`read_anchor`): they
    must match the local ones, and expose a log cut together with its
    checkpoints. Raises :class:`AuditLogNotFound`, :class:`AuditLogCorrupt`
    (unreadable ``log.json``) or :class:`AuditKeyError` (root key missing)
    when verification cannot start; every integrity problem is a finding.
    """
    layout = AuditLayout(Path(directory))
    identity = LogIdentity.read(layout)
    if public_keys is None:
        roots = {identity.root_key_id: layout.keys.public_key(identity.root_key_id)}
    else:
        roots = {key_id(public_key): public_key for public_key in public_keys.values()}
    scan = _scan_checkpoints(layout, identity, roots)
    _check_anchor(anchored, scan, identity)
    scan.findings.extend(_identity_problems(layout, identity, scan.valid))
    evidence = scan.valid + scan.anchored
    signed = {checkpoint.seq: checkpoint.hash for checkpoint in evidence if checkpoint.seq > 0}
    walk = _ChainWalk(identity, signed, _segment_starts(layout))
    walk.run(_Lookahead(_entry(line) for line in iter_lines(layout)))
    findings = walk.findings + scan.findings
    latest = max(evidence, key=lambda checkpoint: (checkpoint.seq, checkpoint.index), default=None)
    covered = latest.seq if latest is not None else 0
    end = walk.expected - 1
    if walk.torn is not None:
        if covered >= walk.expected:
            findings.append(
                Finding(
                    walk.expected,
                    BreakKind.TRUNCATED,
                    f"{walk.torn.line.where}: the log was cut inside record {walk.expected}, "
                    f"but a signed checkpoint covers records up to {covered}",
                )
            )
            walk.missing += covered - end
        else:
            findings.append(
                Finding(
                    walk.expected,
                    BreakKind.TORN_RECORD,
                    f"{walk.torn.line.where}: record {walk.expected} is incomplete (a crash "
                    "interrupted its write); reopening the log quarantines and records it",
                )
            )
            walk.invalid.add(walk.expected)
            end = walk.expected
    elif covered > end:
        findings.append(
            Finding(
                end + 1,
                BreakKind.TRUNCATED,
                f"records {end + 1}..{covered} are covered by a signed checkpoint but missing from the end of the log",
            )
        )
        walk.missing += covered - end
    promised = latest.within if latest is not None else 0
    if end > covered + promised:
        findings.append(
            Finding(
                covered + 1,
                BreakKind.DELETED,
                f"records {covered + 1}..{end} are unsigned, but the last valid checkpoint promised "
                f"the next within {promised} records: later checkpoints were removed",
            )
        )
    total = max(end, covered) + walk.extra
    if total == 0 and not findings:
        findings.append(Finding(None, BreakKind.EMPTY, f"the audit log at {layout.root} holds no records"))
    findings.sort(key=lambda f: (f.seq is None, f.seq if f.seq is not None else 0))
    return VerifyResult(
        directory=layout.root,
        log_id=identity.log_id,
        records_valid=max(total - len(walk.invalid) - walk.missing - walk.extra, 0),
        records_total=total,
        checkpoints_valid=len(scan.valid),
        checkpoints_total=scan.total,
        findings=tuple(findings),
        unsigned_records=max(end - walk.matched_checkpoint, 0) if not findings else 0,
        segments=len(layout.segments()),
        first_time=parse_time(walk.first_time) if walk.first_time else None,
        last_time=parse_time(walk.last_time) if walk.last_time else None,
        trusted_keys=tuple(scan.trusted),
    )
