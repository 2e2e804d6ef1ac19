"""Concurrent transactions commit together once their audit records are durable, sharing the log's sync.

A transaction writes its audit record in its body and waits for it outside the database's lock
(``before_commit``), so the others write theirs meanwhile and one ``fdatasync`` covers them all; nothing
commits before its record is durable, and a failed sync rolls back every transaction it was to cover.
``os.fdatasync`` is wrapped (the real one still runs) to hold the audit log's first sync until every
writer has written, as a slow disk would, and made to fail once in the failure test: an I/O error from a
real disk cannot be produced here.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from cantata.security.audit import Action, AuditEntry, AuditLog, AuditLogUnavailable, init_audit, verify
from cantata.security.audit.record import canonical
from cantata.server.database import Database
from testkit.waiting import wait_for

ADMIN = "spiffe://cantata/admin/root"
WRITERS = 8


@pytest.fixture
def database(tmp_path: Path):
    opened = Database(tmp_path / "state.db", migrations=("CREATE TABLE acts (i INTEGER PRIMARY KEY)",))
    yield opened
    opened.close()


@pytest.fixture
def log(tmp_path: Path):
    init_audit(tmp_path / "audit")
    with AuditLog.open(tmp_path / "audit") as opened:
        yield opened


def _committed(database: Database) -> set[int]:
    with sqlite3.connect(database.path) as outside:
        return {row[0] for row in outside.execute("SELECT i FROM acts")}


def _act(database: Database, log: AuditLog, i: int, results: dict[int, object], *, fail: bool = False) -> None:
    try:
        with database.transaction() as db:
            db.execute("INSERT INTO acts VALUES (?)", (i,))
            if fail:
                raise ValueError("this act is refused")
            records, durable = log.write_all([AuditEntry(ADMIN, Action.JOB_SUBMITTED, resource=f"job-{i}")])
            database.before_commit(durable)
        results[i] = (records[0].seq, log._durable_seq)
    except Exception as exc:
        results[i] = exc


def _run(target, count: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def _hold_first_audit_sync(monkeypatch, database: Database, until, *, fail: bool = False) -> dict[str, list]:
    """Wrap fdatasync: the audit log's first sync waits for ``until()`` (and raises EIO if ``fail``)."""
    real = os.fdatasync
    seen: dict[str, list] = {"audit": [], "wal": [], "committed_during_sync": []}
    first = threading.Event()

    def wrapped(fd: int) -> None:
        if fd == database._wal_fd:
            seen["wal"].append(fd)
            return real(fd)
        seen["audit"].append(fd)
        if not first.is_set():
            first.set()
            wait_for(until, interval=0.01)
            seen["committed_during_sync"].append(_committed(database))
            if fail:
                raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", wrapped)
    return seen


def test_concurrent_transactions_share_the_audit_sync_and_commit_only_once_durable(database, log, monkeypatch):
    start = log.last_seq
    seen = _hold_first_audit_sync(monkeypatch, database, lambda: log.last_seq == start + WRITERS)
    results: dict[int, object] = {}
    for thread in _run(lambda i: _act(database, log, i, results), WRITERS):
        thread.join()
    # Every writer wrote its record while the first sync was held: nobody held the lock across it.
    assert seen["committed_during_sync"] == [set()]  # and nothing was committed before its record was durable
    assert all(isinstance(r, tuple) and r[1] >= r[0] for r in results.values()), results  # each returned durable
    assert _committed(database) == set(range(WRITERS))
    assert len(seen["audit"]) <= 2 < WRITERS  # the records behind the first sync shared the second
    assert len(seen["wal"]) <= 2 < WRITERS  # and the commits shared the write-ahead log's
    assert database._commits == WRITERS
    assert verify(log.layout.root).ok


def test_a_failed_audit_sync_rolls_back_every_transaction_it_was_to_cover(database, log, monkeypatch):
    start = log.last_seq
    _hold_first_audit_sync(monkeypatch, database, lambda: log.last_seq == start + WRITERS, fail=True)
    results: dict[int, object] = {}
    for thread in _run(lambda i: _act(database, log, i, results), WRITERS):
        thread.join()
    assert all(isinstance(r, AuditLogUnavailable) for r in results.values()), results
    assert _committed(database) == set()
    assert log.last_seq == start  # the records were cut back with the acts
    _act(database, log, 100, results)  # the disk is back: the next act commits
    assert isinstance(results[100], tuple) and _committed(database) == {100}
    log.close()
    assert verify(log.layout.root).ok


def test_a_transaction_that_raises_rolls_back_alone_in_its_batch(database, log, monkeypatch):
    results: dict[int, object] = {}
    _hold_first_audit_sync(monkeypatch, database, lambda: 1 in results)  # 1 runs while 0's sync is held
    first = _run(lambda i: _act(database, log, i, results), 1)[0]
    wait_for(lambda: log.last_seq > 0 and database._batch is not None)
    _act(database, log, 1, results, fail=True)
    first.join()
    assert isinstance(results[1], ValueError)
    assert isinstance(results[0], tuple)
    assert _committed(database) == {0}


@pytest.mark.parametrize(
    "details", [{}, {"name": 'quote " and \\ slash', "nested": {"b": [1, 2.5, None, True], "a": "é \u2028"}}]
)
def test_records_are_stored_in_canonical_form_with_their_hash(log, details):
    record = log.append(ADMIN, Action.JOB_SUBMITTED, resource="job-\u00e9", tenant="acme", details=details)
    line = log.layout.segment_path(1).read_bytes().splitlines()[-1]
    assert line == canonical(record.to_dict())


def _act_alongside(database: Database, log: AuditLog, i: int, results: dict[int, object], ran: list[int]) -> None:
    """An act whose record is synced beside its commit (a submit's way), undone if the record's sync fails."""

    def undo() -> None:
        with database.transaction() as db:
            db.execute("DELETE FROM acts WHERE i=?", (i,))

    try:
        with database.transaction() as db:
            db.execute("INSERT INTO acts VALUES (?)", (i,))
            database.after_commit(lambda: ran.append(i))
            records, durable = log.write_all([AuditEntry(ADMIN, Action.JOB_SUBMITTED, resource=f"job-{i}")])
            database.alongside_commit(durable, undo)
        results[i] = (records[0].seq, log._durable_seq)
    except Exception as exc:
        results[i] = exc


def test_records_synced_beside_the_commit_return_once_both_are_durable(database, log, monkeypatch):
    start, ran = log.last_seq, []
    seen = _hold_first_audit_sync(monkeypatch, database, lambda: log.last_seq == start + WRITERS)
    results: dict[int, object] = {}
    for thread in _run(lambda i: _act_alongside(database, log, i, results, ran), WRITERS):
        thread.join()
    assert seen["committed_during_sync"][0]  # committed while the record's sync ran: side by side, not after it
    assert all(isinstance(r, tuple) and r[1] >= r[0] for r in results.values()), results  # each returned durable
    assert _committed(database) == set(range(WRITERS)) and sorted(ran) == list(range(WRITERS))
    assert len(seen["audit"]) <= 2 < WRITERS  # the records behind the first sync shared the second


def test_a_failed_record_sync_beside_the_commit_undoes_every_act_it_was_to_cover(database, log, monkeypatch):
    start, ran = log.last_seq, []
    _hold_first_audit_sync(monkeypatch, database, lambda: log.last_seq == start + WRITERS, fail=True)
    results: dict[int, object] = {}
    for thread in _run(lambda i: _act_alongside(database, log, i, results, ran), WRITERS):
        thread.join()
    assert all(isinstance(r, AuditLogUnavailable) for r in results.values()), results
    assert _committed(database) == set() and ran == []  # undone, and no hook told anyone of them
    assert log.last_seq == start
    _act_alongside(database, log, 100, results, ran)  # the disk is back: the next act stands
    assert isinstance(results[100], tuple) and _committed(database) == {100} and ran == [100]
    log.close()
    assert verify(log.layout.root).ok
