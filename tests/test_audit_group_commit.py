"""Group commit: concurrent appends share one ``fdatasync``, each returns only once its record is synced,
and a sync that fails fails every append it was to cover and leaves the log verifiable.

``os.fdatasync`` is wrapped (the real one still runs) to see which records each sync covered, and made to
fail once in the failure test: an I/O error from a real disk cannot be produced here.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from cantata.security.audit import Action, AuditLog, AuditLogUnavailable, init_audit, read_records, verify
from testkit.waiting import wait_for

ADMIN = "spiffe://cantata/admin/root"
THREADS = 16


@pytest.fixture
def log(tmp_path):
    directory = tmp_path / "audit"
    init_audit(directory)
    with AuditLog.open(directory) as opened:
        yield opened


def _append_from_threads(log: AuditLog, count: int, results: dict[int, object]) -> list[threading.Thread]:
    def one(i: int) -> None:
        try:
            results[i] = log.append(ADMIN, Action.JOB_SUBMITTED, resource=f"job-{i}").seq
        except AuditLogUnavailable as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_concurrent_appends_share_syncs_and_each_returns_synced(log, monkeypatch):
    real = os.fdatasync
    start = log.last_seq
    synced: list[int] = []  # the last record each finished sync covered
    first = threading.Event()

    def counted(fd: int) -> None:
        covered = log.last_seq
        if not first.is_set():  # hold the first sync until every thread has written its record
            first.set()
            wait_for(lambda: log.last_seq == start + THREADS, interval=0.01)
        real(fd)
        synced.append(covered)

    monkeypatch.setattr(os, "fdatasync", counted)
    results: dict[int, object] = {}
    threads = _append_from_threads(log, THREADS, results)
    for thread in threads:
        thread.join()
    seqs = sorted(results.values())
    assert seqs == list(range(start + 1, start + THREADS + 1))
    assert len(synced) <= 2 < THREADS  # the writes waiting behind the first sync shared the second
    assert max(synced) == start + THREADS
    assert [r.seq for r in read_records(log.layout.root)][-THREADS:] == seqs
    log.close()
    assert verify(log.layout.root).ok


def test_a_failed_sync_fails_every_append_it_would_have_covered(log, monkeypatch):
    real = os.fdatasync
    start = log.last_seq
    failed = threading.Event()

    def failing_once(fd: int) -> None:
        if not failed.is_set():
            failed.set()
            wait_for(lambda: log.last_seq == start + 2, interval=0.01)  # the second append wrote meanwhile
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", failing_once)
    results: dict[int, object] = {}
    for thread in _append_from_threads(log, 2, results):
        thread.join()
    assert all(isinstance(r, AuditLogUnavailable) for r in results.values()), results
    assert "cannot be synced" in (log.failure or "")
    assert log.last_seq == start  # both records were cut back
    after = log.append(ADMIN, Action.JOB_CANCELLED, resource="job-after")
    assert after.seq == start + 1 and log.failure is None
    stored = [r for r in read_records(log.layout.root) if r.resource.startswith("job-")]
    assert [r.resource for r in stored] == ["job-after"]
    log.close()
    assert verify(Path(log.layout.root)).ok
