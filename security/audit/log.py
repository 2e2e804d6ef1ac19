"""Creating an audit log and appending to it.

Durability: with ``Durability.EACH_RECORD`` (the default) every record is
written with one ``write`` and ``fdatasync``ed before :meth:`AuditLog.append`
returns, so an acknowledged record survives a crash. Concurrent appends share
syncs (group commit): each writes its records under the log's lock, then
waits outside it until a sync that started after its write has finished; the
first waiter runs that sync for all of them, while later appends keep writing. ``Durability.AT_CHECKPOINT``
leaves records in the OS page cache until the next checkpoint (a crash can
lose the unsigned tail); it exists for bulk loads and measurements.
Checkpoints are fsynced after the records they cover, and are written on
opening (covering whatever a crash left unsigned), every
``checkpoint_every_records`` records, within ``checkpoint_every_seconds`` of
the first unsigned record, at key rotation and at :meth:`AuditLog.close`.

A crash can leave a torn last line. :meth:`AuditLog.open` proves every
record after the last signed checkpoint (:mod:`.tail`), moves torn trailing
bytes into ``quarantine/`` and appends an ``audit_log_recovered`` record naming
them, so the loss is on the signed record rather than silently dropped; any
other damage refuses the open.

Fail closed: a write that fails (a full disk, an I/O error) is cut back to the
file's last good size and raises :class:`AuditLogUnavailable`, so the caller
does not act; a sync that fails cuts the file back to what the last good sync
covered, and every append whose records it cut raises; :attr:`AuditLog.failure` says why until a write succeeds again,
which the next append (or :meth:`AuditLog.probe`) tries by itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .actions import Action, Outcome
from .checkpoint import FIRST_PREV, Checkpoint, line_hash
from .details import screen_details
from .errors import AuditLogBusy, AuditLogClosed, AuditLogCorrupt, AuditLogExists, AuditLogUnavailable
from .fsutil import fsync_directory, write_all, write_atomically, write_new_file
from .layout import AuditLayout, LogIdentity
from .record import AuditRecord, RecordTemplate, format_time, genesis_hash
from .segments import LogLine, read_file, split_lines
from .tail import Unsigned, check_tail

_log = logging.getLogger(__name__)
_WORD = re.compile(r"[a-z][a-z0-9_]*")
SYSTEM_ACTOR = "cantata:audit"


@dataclass(frozen=True)
class AuditEntry:
    """One act to record (what :meth:`AuditLog.append` takes), for :meth:`AuditLog.append_all`."""

    actor: str
    action: Action | str
    resource: str = ""
    tenant: str = ""
    outcome: Outcome | str = Outcome.OK
    details: dict | None = None
    peer: str = ""


@functools.lru_cache(maxsize=1024)  # a few dozen actions and outcomes, in every record
def _word(name: str, word: str) -> str:
    """``word`` as a plain string if it is a lowercase word; ``ValueError`` if not (never remembered)."""
    if _WORD.fullmatch(word) is None:
        raise ValueError(f"{name} must be a lowercase word like 'job_submitted', got {word!r}")
    return str(word)


class _Checked(NamedTuple):
    """An entry's fields, checked: plain strings, and details screened (see :func:`_checked`)."""

    actor: str
    action: str
    resource: str
    tenant: str
    outcome: str
    details: dict
    peer: str


def _checked(entry: AuditEntry) -> _Checked:
    """``entry`` with its words as plain strings and its details screened; ``ValueError`` if a field is malformed."""
    actor, action, outcome = entry.actor, entry.action, entry.outcome
    if not isinstance(actor, str) or not actor:
        raise ValueError("an audit record needs a non-empty actor")
    for name, word in (("action", action), ("outcome", outcome)):
        if not isinstance(word, str):
            raise ValueError(f"{name} must be a lowercase word like 'job_submitted', got {word!r}")
    for name, text in (("resource", entry.resource), ("tenant", entry.tenant), ("peer", entry.peer)):
        if not isinstance(text, str):
            raise ValueError(f"{name} must be a string, got {type(text).__name__}")
    details = {} if entry.details is None else screen_details(entry.details)
    return _Checked(
        actor, _word("action", action), entry.resource, entry.tenant, _word("outcome", outcome), details, entry.peer
    )


def _nothing() -> None:
    """The wait of records that need none."""


class Durability(StrEnum):
    """When appended records reach stable storage."""

    EACH_RECORD = "each_record"
    AT_CHECKPOINT = "at_checkpoint"


def init_audit(directory: Path) -> str:
    """Create an audit log in ``directory`` with its first Ed25519 key; return the key id.

    Writes the keys, the genesis checkpoint (sequence 0, signed), and last
    ``log.json``, whose presence marks a complete log.
    """
    layout = AuditLayout(Path(directory))
    if layout.identity_path.exists():
        raise AuditLogExists(f"an audit log already exists at {layout.root}")
    layout.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    layout.segments_dir.mkdir(mode=0o700, exist_ok=True)
    layout.keys.path.mkdir(mode=0o700, exist_ok=True)
    kid, private_key = layout.keys.create_key()
    layout.keys.set_active(kid)
    identity = LogIdentity(log_id=secrets.token_hex(16), root_key_id=kid, created=datetime.now(UTC))
    genesis = Checkpoint.sign(
        private_key,
        index=0,
        seq=0,
        chain_hash=genesis_hash(identity.log_id),
        time=identity.created,
        log_id=identity.log_id,
        prev=FIRST_PREV,
        within=0,
    )
    layout.checkpoints_path.unlink(missing_ok=True)
    write_new_file(layout.checkpoints_path, genesis.to_line() + b"\n", mode=0o600)
    write_atomically(layout.identity_path, identity.to_bytes())
    return kid


@dataclass(frozen=True)
class _Tail:
    """Where a log file's intact content ends, and any torn bytes after it."""

    last: LogLine | None
    torn: LogLine | None


def _read_tail(number: int, data: bytes) -> _Tail:
    last = torn = None
    for line in split_lines(number, data, final=True):
        if line.torn:
            torn = line
        else:
            last = line
    return _Tail(last, torn)


class AuditLog:
    """An open, append-only audit log; one writer process at a time. Thread-safe."""

    # What the log held when it was opened: the last signed checkpoint's seq, and by seq each record after it, which
    # a crash may have cut short or left without its act (a server reconciles its acts with them on start).
    signed_at_open: int
    unsigned_at_open: dict[int, Unsigned]
    # Where the log stands; set by _load_checkpoint_tail and _load_segment_tail.
    _seq: int
    _head: str
    _segment_number: int
    _segment_size: int
    _checkpoint_index: int
    _checkpoint_seq: int
    _checkpoint_prev: str
    _checkpoint_hash: str
    _checkpoint_size: int

    def __init__(
        self,
        layout: AuditLayout,
        identity: LogIdentity,
        lock_fd: int,
        *,
        every_records: int,
        every_seconds: float,
        segment_max_bytes: int,
        durability: Durability,
    ):
        self.layout = layout
        self.identity = identity
        self._log_id = identity.log_id
        self._lock_fd = lock_fd
        self._every_records = every_records
        self._every_seconds = every_seconds
        self._segment_max_bytes = segment_max_bytes
        self._durability = durability
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._closed = False
        self._key_id = layout.keys.active_id()
        self._private_key = layout.keys.private_key(self._key_id)
        self._recovered: list[dict[str, object]] = []
        self._failure: str | None = None  # why the last write failed, until one succeeds
        self._broken: str | None = None  # a failed write could not be undone: refuse until reopened
        self._load_checkpoint_tail()
        self._load_segment_tail()
        # Group commit: what the last good sync covered, the one sync running, and which appends a failed one cut.
        self._sync_cv = threading.Condition(threading.Lock())  # taken after self._lock, never before it
        self._syncing = False
        self._durable_seq, self._durable_head, self._durable_size = self._seq, self._head, self._segment_size
        self._generation = 0  # one more each time a failed sync cuts records back
        self._cut_at: dict[int, int] = {}  # generation -> the durable seq it was cut back to
        self._checkpoint_fd = os.open(layout.checkpoints_path, os.O_WRONLY | os.O_APPEND)
        self._segment_fd = os.open(
            layout.segment_path(self._segment_number), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
        )
        self._first_unsigned_at: float | None = None
        try:
            self._checkpoint_locked()
            for details in self._recovered:
                self._append_locked(
                    [self._prepare(AuditEntry(SYSTEM_ACTOR, Action.AUDIT_LOG_RECOVERED, details=details))]
                )
                self._sync_locked()
        except BaseException:
            os.close(self._segment_fd)
            os.close(self._checkpoint_fd)
            raise
        self._timer = threading.Thread(target=self._run_timer, name="audit-checkpoints", daemon=True)
        self._timer.start()

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        checkpoint_every_records: int = 1000,
        checkpoint_every_seconds: float = 60.0,
        segment_max_bytes: int = 8 << 20,
        durability: Durability = Durability.EACH_RECORD,
    ) -> AuditLog:
        """Open the log in ``directory`` for appending, recovering from a crash if one left a torn tail."""
        if checkpoint_every_records < 1 or checkpoint_every_seconds <= 0 or segment_max_bytes < 1024:
            raise ValueError("checkpoint intervals must be positive and segments at least 1 KiB")
        layout = AuditLayout(Path(directory))
        identity = LogIdentity.read(layout)
        lock_fd = os.open(layout.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise AuditLogBusy(f"the audit log at {layout.root} is open in another process") from None
        try:
            return cls(
                layout,
                identity,
                lock_fd,
                every_records=checkpoint_every_records,
                every_seconds=checkpoint_every_seconds,
                segment_max_bytes=segment_max_bytes,
                durability=Durability(durability),
            )
        except BaseException:
            os.close(lock_fd)
            raise

    @property
    def failure(self) -> str | None:
        """Why the log cannot be written, while the last write failed; None when it can."""
        return self._broken or self._failure

    def probe(self) -> str | None:
        """While writes fail, try to sign a checkpoint (so space that returned is noticed); return :attr:`failure`."""
        with self._lock:
            self._check_open()
            if self._failure is not None and self._broken is None:
                with contextlib.suppress(AuditLogUnavailable):
                    self._checkpoint_locked()
            return self.failure

    def require_writable(self) -> None:
        """Raise :class:`AuditLogUnavailable` while the log cannot be written (after a :meth:`probe`)."""
        failure = self.probe()
        if failure is not None:
            raise AuditLogUnavailable(failure)

    @property
    def last_seq(self) -> int:
        """Sequence number of the last record appended (0 for none)."""
        return self._seq

    def append(
        self,
        actor: str,
        action: Action | str,
        *,
        resource: str = "",
        tenant: str = "",
        outcome: Outcome | str = Outcome.OK,
        details: dict | None = None,
        peer: str = "",
    ) -> AuditRecord:
        """Record one act, durably, and return the stored record.

        Raises :class:`AuditLogUnavailable` when the record cannot be written
        (the log is left exactly as it was), so the act must not happen.
        ``details`` is screened: a field named like secret material (``key``,
        ``password``, ``token``...) raises :class:`SecretMaterialError`, a
        ``ValueError``.
        """
        entry = AuditEntry(actor, action, resource=resource, tenant=tenant, outcome=outcome, details=details, peer=peer)
        return self.append_all([entry])[0]

    def append_all(self, entries: Sequence[AuditEntry]) -> list[AuditRecord]:
        """Record several acts of one action together: all of them durably, or (raising) none.

        One write and one sync carry every record, so a failure leaves the log
        as it was, as :meth:`append` does for one; an act that needs several
        records (an approval: the tenant, its key, its certificate) never has
        only some of them. Each entry is checked as :meth:`append` checks it.
        """
        records, durable = self.write_all(entries)
        durable()
        return records

    def write_all(self, entries: Sequence[AuditEntry]) -> tuple[list[AuditRecord], Callable[[], None]]:
        """Write records as :meth:`append_all` does, and return them with a wait for their durability.

        The wait returns once a sync covers them (at once with ``AT_CHECKPOINT``),
        or raises :class:`AuditLogUnavailable` if a failed sync cut them: until it
        returned, the acts they record must not take effect. Concurrent waits
        share syncs.
        """
        prepared = [self._prepare(entry) for entry in entries]
        with self._lock:
            self._check_open()
            records = self._append_locked(prepared)
            generation = self._generation
        if self._durability is not Durability.EACH_RECORD or not records:
            return records, _nothing
        return records, functools.partial(self._await_durable, records[-1].seq, generation)

    def checkpoint(self) -> None:
        """Sign a checkpoint now, covering every record appended so far."""
        with self._lock:
            self._check_open()
            self._checkpoint_locked()

    def rotate_key(self, *, actor: str = SYSTEM_ACTOR) -> str:
        """Switch to a fresh signing key and return its id.

        The outgoing key signs a checkpoint naming the new key, so a verifier
        that trusts the first key trusts every later one; the outgoing private
        key is then deleted, so history already signed cannot be re-signed.
        """
        with self._lock:
            self._check_open()
            old_id = self._key_id
            new_id, new_key = self.layout.keys.create_key()
            self._checkpoint_locked(next_key=new_key.public_key())
            self.layout.keys.set_active(new_id)
            self._key_id, self._private_key = new_id, new_key
            self.layout.keys.destroy_private_key(old_id)
            rotated = {"old_key_id": old_id, "new_key_id": new_id}
            entry = AuditEntry(actor, Action.AUDIT_KEY_ROTATED, resource=f"audit-key:{new_id}", details=rotated)
            self._append_locked([self._prepare(entry)])
            self._checkpoint_locked()  # syncs the record first
            return new_id

    def close(self) -> None:
        """Write a final signed checkpoint and release the log. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                self._checkpoint_locked()
            except AuditLogUnavailable:  # the next open proves the unsigned tail and signs it
                _log.error("audit log at %s closed without a final checkpoint: %s", self.layout.root, self.failure)
            self._closed = True
            self._stop.set()
            os.close(self._segment_fd)
            os.close(self._checkpoint_fd)
            os.close(self._lock_fd)
        self._timer.join()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals (callers hold self._lock) --

    def _check_open(self) -> None:
        if self._closed:
            raise AuditLogClosed(f"the audit log at {self.layout.root} is closed")

    def _write(self, fd: int, offset: int, data: bytes, sync) -> None:
        """Append ``data`` at ``offset`` (the file's last good size) and sync it, or leave the file as it was.

        A short or failed write, or a failed sync, is cut back to ``offset``
        and raises :class:`AuditLogUnavailable`; if even that fails the log
        refuses every write until it is reopened (which proves and repairs its tail).
        """
        if self._broken is not None:
            raise AuditLogUnavailable(self._broken)
        try:
            write_all(fd, data)
            if sync is not None:
                sync(fd)
        except OSError as exc:
            self._failure = f"the audit log cannot be written: {exc.strerror or exc}"
            try:
                os.ftruncate(fd, offset)
                os.fsync(fd)
            except OSError as undo:
                self._broken = f"{self._failure}; the failed write could not be undone ({undo.strerror or undo})"
            _log.error("audit log at %s: %s", self.layout.root, self.failure)
            raise AuditLogUnavailable(self.failure) from exc
        if self._failure is not None:
            _log.warning("audit log at %s can be written again", self.layout.root)
        self._failure = None

    def _prepare(self, entry: AuditEntry) -> tuple[_Checked, RecordTemplate]:
        """``entry`` checked, and its fields encoded (before the lock: see :meth:`_append_locked`)."""
        e = _checked(entry)
        template = RecordTemplate(
            log=self._log_id,
            actor=e.actor,
            action=e.action,
            resource=e.resource,
            tenant=e.tenant,
            outcome=e.outcome,
            peer=e.peer,
            details=e.details,
        )
        return e, template

    def _append_locked(self, prepared: list[tuple[_Checked, RecordTemplate]]) -> list[AuditRecord]:
        """Write the records (not yet synced: see :meth:`_await_durable` and :meth:`_sync_locked`).

        Their fields were encoded before the lock (:meth:`_prepare`): here they only get their place in the chain.
        """
        now = datetime.now(UTC)
        moment = format_time(now)
        seq, head, log_id = self._seq, self._head, self._log_id
        lines, records = [], []
        for entry, template in prepared:
            seq += 1
            line, chain_hash = template.line(seq, moment, head)
            lines.append(line)
            records.append(
                AuditRecord(
                    seq,
                    now,
                    log_id,
                    entry.actor,
                    entry.action,
                    entry.resource,
                    entry.tenant,
                    entry.outcome,
                    entry.peer,
                    entry.details,
                    head,
                    chain_hash,
                )
            )
            head = chain_hash
        data = lines[0] if len(lines) == 1 else b"".join(lines)
        if self._seq - self._checkpoint_seq >= self._every_records:
            self._checkpoint_locked()  # the one due failed: keep the promise before writing more
        if self._segment_size and self._segment_size + len(data) > self._segment_max_bytes:
            self._start_segment(self._segment_number + 1)
        self._write(self._segment_fd, self._segment_size, data, None)
        self._seq, self._head = seq, head
        self._segment_size += len(data)
        if self._first_unsigned_at is None:
            self._first_unsigned_at = time.monotonic()
        if (
            self._seq - self._checkpoint_seq >= self._every_records
            or time.monotonic() - self._first_unsigned_at >= self._every_seconds
        ):
            try:
                self._checkpoint_locked()
            except AuditLogUnavailable:  # the next append signs first; this one's sync decides its fate
                _log.warning("audit checkpoint failed after record %d: %s", self._seq, self._failure)
        return records

    def _await_durable(self, seq: int, generation: int) -> None:
        """Return once record ``seq`` (written in ``generation``) is synced; raise if a failed sync cut it.

        The first caller that finds no sync running runs one for everything written so far, outside the
        log's lock; the others wait for it, and one of them starts the next for what was written meanwhile.
        """
        while True:
            with self._sync_cv:
                while True:
                    if generation != self._generation and seq > self._cut_at[generation]:
                        raise AuditLogUnavailable(self.failure or "the audit log cannot be written")
                    if self._durable_seq >= seq:
                        return
                    if not self._syncing:
                        self._syncing = True
                        break
                    self._sync_cv.wait()
            synced = None
            try:
                synced = self._lead_sync()
            finally:
                with self._sync_cv:  # one wake of the waiters: they return, or one of them leads the next sync
                    if synced is not None:
                        self._advance_durable(*synced)
                    self._syncing = False
                    self._sync_cv.notify_all()

    def _lead_sync(self) -> tuple[int, str, int, int, int] | None:
        """One ``fdatasync`` of the segment for every record written before it started; what it made durable
        (None if nothing: a failed sync cut the records back, or the close's final sync covered them)."""
        with self._lock:
            if self._closed or self._broken is not None:  # the close's final sync, if it worked, covered them
                with self._sync_cv:
                    if self._durable_seq >= self._seq:
                        return None
                raise AuditLogUnavailable(self._broken or f"the audit log at {self.layout.root} was closed unsynced")
            target = (self._seq, self._head, self._segment_size, self._segment_number, self._generation)
            fd = os.dup(self._segment_fd)  # a segment rotation may close the original meanwhile
        try:
            os.fdatasync(fd)
        except OSError as exc:
            with self._lock:
                self._cut_back(exc, target[4])
            return None
        finally:
            os.close(fd)
        return target

    def _mark_durable(self, seq: int, head: str, size: int, segment: int, generation: int) -> None:
        with self._sync_cv:
            self._advance_durable(seq, head, size, segment, generation)
            self._sync_cv.notify_all()

    def _advance_durable(self, seq: int, head: str, size: int, segment: int, generation: int) -> None:
        """Records up to ``seq`` are synced (unless a failed sync cut them meanwhile). Holds ``_sync_cv``."""
        if generation == self._generation and seq > self._durable_seq:
            self._durable_seq, self._durable_head = seq, head
            if segment == self._segment_number:
                self._durable_size = size

    def _sync_locked(self) -> None:
        """Sync every record written so far, under the log's lock (checkpoints, key rotation, rotation)."""
        if self._durability is not Durability.EACH_RECORD:
            return
        with self._sync_cv:
            if self._durable_seq >= self._seq:
                return
            generation = self._generation
        try:
            os.fdatasync(self._segment_fd)
        except OSError as exc:
            self._cut_back(exc, generation)
            raise AuditLogUnavailable(self.failure) from exc
        self._mark_durable(self._seq, self._head, self._segment_size, self._segment_number, generation)

    def _cut_back(self, exc: OSError, generation: int) -> None:
        """A sync failed: cut the segment back to what the last good sync covered (callers hold ``_lock``)."""
        with self._sync_cv:
            if generation != self._generation:
                return  # another failure cut it back already
            self._failure = f"the audit log cannot be synced: {exc.strerror or exc}"
            try:
                os.ftruncate(self._segment_fd, self._durable_size)
                os.fsync(self._segment_fd)
            except OSError as undo:
                self._broken = f"{self._failure}; the failed sync could not be undone ({undo.strerror or undo})"
            _log.error("audit log at %s: %s", self.layout.root, self.failure)
            self._cut_at[self._generation] = self._durable_seq
            self._generation += 1
            self._seq, self._head, self._segment_size = self._durable_seq, self._durable_head, self._durable_size
            self._sync_cv.notify_all()

    def _start_segment(self, number: int) -> None:
        if self._broken is not None:
            raise AuditLogUnavailable(self._broken)
        try:
            os.fsync(self._segment_fd)
            fd = os.open(self.layout.segment_path(number), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            self._failure = f"the audit log cannot start segment {number}: {exc.strerror or exc}"
            raise AuditLogUnavailable(self._failure) from exc
        try:
            fsync_directory(self.layout.segments_dir)
        except OSError as exc:
            os.close(fd)
            self._failure = f"the audit log cannot start segment {number}: {exc.strerror or exc}"
            raise AuditLogUnavailable(self._failure) from exc
        os.close(self._segment_fd)
        self._segment_fd = fd
        with self._sync_cv:  # the fsync above made every record so far durable
            self._durable_seq, self._durable_head, self._durable_size = self._seq, self._head, 0
            self._sync_cv.notify_all()
        self._segment_number, self._segment_size = number, 0

    def _checkpoint_locked(self, next_key: Ed25519PublicKey | None = None) -> None:
        if self._durability is Durability.AT_CHECKPOINT:
            try:
                os.fsync(self._segment_fd)
            except OSError as exc:
                self._failure = f"the audit log cannot be written: {exc.strerror or exc}"
                raise AuditLogUnavailable(self._failure) from exc
        else:
            self._sync_locked()  # a checkpoint covers only records on disk
        checkpoint = Checkpoint.sign(
            self._private_key,
            index=self._checkpoint_index + 1,
            seq=self._seq,
            chain_hash=self._head,
            time=datetime.now(UTC),
            log_id=self.identity.log_id,
            prev=self._checkpoint_prev,
            within=self._every_records,
            next_key=next_key,
        )
        line = checkpoint.to_line()
        self._write(self._checkpoint_fd, self._checkpoint_size, line + b"\n", os.fsync)
        self._checkpoint_size += len(line) + 1
        self._checkpoint_index, self._checkpoint_prev = checkpoint.index, line_hash(line)
        self._checkpoint_seq, self._first_unsigned_at = checkpoint.seq, None

    def _run_timer(self) -> None:
        wait = self._every_seconds
        while not self._stop.wait(wait):
            with self._lock:
                if self._closed:
                    return
                wait = self._every_seconds
                if self._first_unsigned_at is not None:
                    remaining = self._first_unsigned_at + self._every_seconds - time.monotonic()
                    if remaining > 0:
                        wait = remaining
                        continue
                    try:
                        self._checkpoint_locked()
                    except (OSError, AuditLogUnavailable):
                        _log.exception("audit checkpoint failed; retrying in %.0f s", wait)

    def _quarantine(self, path: Path, torn: LogLine) -> None:
        """Move torn trailing bytes of ``path`` into ``quarantine/`` and note them for the recovery record."""
        self.layout.quarantine_dir.mkdir(mode=0o700, exist_ok=True)
        digest = hashlib.sha256(torn.raw).hexdigest()
        evidence = self.layout.quarantine_dir / f"{path.name}.{torn.offset}.{digest[:16]}.torn"
        if not evidence.exists():
            write_new_file(evidence, torn.raw, mode=0o600)
        os.truncate(path, torn.offset)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _log.warning("audit log: quarantined %d torn bytes of %s at offset %d", len(torn.raw), path, torn.offset)
        self._recovered.append(
            {
                "file": str(path.relative_to(self.layout.root)),
                "offset": torn.offset,
                "length": len(torn.raw),
                "sha256": digest,
                "quarantined_as": str(evidence.relative_to(self.layout.root)),
            }
        )

    def _load_checkpoint_tail(self) -> None:
        path = self.layout.checkpoints_path
        tail = _read_tail(0, read_file(path))
        if tail.torn is not None:
            self._quarantine(path, tail.torn)
        if tail.last is None or tail.last.stored is None:
            raise AuditLogCorrupt(f"{path}: the last checkpoint is unreadable; run `cantata audit verify`")
        last = Checkpoint.from_stored(tail.last.stored)
        if last.log_id != self.identity.log_id:
            raise AuditLogCorrupt(f"{path}: the last checkpoint belongs to another log; run `cantata audit verify`")
        self._checkpoint_index, self._checkpoint_seq, self._checkpoint_hash = last.index, last.seq, last.hash
        self._checkpoint_prev = line_hash(tail.last.raw)
        self._checkpoint_size = path.stat().st_size

    def _load_segment_tail(self) -> None:
        """Prove every record after the last checkpoint, then quarantine a torn tail if there is one."""
        tail = check_tail(self.layout, self.identity.log_id, self._checkpoint_seq, self._checkpoint_hash)
        self.signed_at_open, self.unsigned_at_open = self._checkpoint_seq, tail.unsigned
        self._seq, self._head = tail.seq, tail.head
        self._segment_number, self._segment_size = tail.segment_number, tail.segment_size
        if tail.torn is not None:
            self._quarantine(*tail.torn)
