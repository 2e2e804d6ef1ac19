"""The database's group commit and its readers: writers share WAL syncs, readers never wait on a writer.

``os.fdatasync`` is wrapped (the real one still runs) to count the syncs and to hold the first one until
every writer has committed, as a slow disk would.
"""

from __future__ import annotations

import datetime as dt
import os
import threading

import pytest

from cantata.proto.v1 import common_pb2
from cantata.server.database import Database
from cantata.server.store import Store
from testkit.waiting import wait_for

WRITERS = 8


@pytest.fixture
def store(tmp_path):
    opened = Store(Database(tmp_path / "state.db"))
    yield opened
    opened.close()


def test_concurrent_commits_share_wal_syncs_and_each_returns_synced(store, monkeypatch):
    real = os.fdatasync
    syncs: list[int] = []
    first = threading.Event()

    def counted(fd: int) -> None:
        if not first.is_set():  # a slow first sync: every writer commits behind it
            first.set()
            wait_for(lambda: store.database._commits == WRITERS, interval=0.01)
        real(fd)
        syncs.append(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    threads = [
        threading.Thread(target=store.add_tenancy_request, args=(f"t{i}", b"csr", f"fp{i}")) for i in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {t.name for t in store.tenants()} == {f"t{i}" for i in range(WRITERS)}
    assert len(syncs) <= 2 < WRITERS  # the commits behind the first sync shared the second
    assert store.database._synced == WRITERS


def test_reads_do_not_wait_for_an_open_write_transaction(store):
    store.add_tenancy_request("acme", b"csr", "fp")
    inside, release = threading.Event(), threading.Event()

    def slow_writer() -> None:
        with store.database.transaction() as db:
            db.execute("UPDATE tenants SET status='SUSPENDED' WHERE name='acme'")
            inside.set()
            release.wait()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    inside.wait()
    try:
        # Answered while the writer holds the lock, from committed state (a waiting read would hang here).
        assert store.tenant("acme").status == "PENDING"
        assert store.tenant_status("acme") == "PENDING"
    finally:
        release.set()
        writer.join()
    assert store.tenant("acme").status == "SUSPENDED"


def test_cached_answers_change_when_the_change_commits(store):
    store.add_tenancy_request("acme", b"csr", "fp")
    quota = common_pb2.Quota(max_concurrent_jobs=1, max_workers_per_job=1, max_total_steps=10)
    assert store.tenant_status("acme") == "PENDING"
    store.approve_tenant("acme", "fp", b"cert", quota, "admin")
    assert store.tenant_status("acme") == "APPROVED"
    store.record_certificate(0xABC, "spiffe://cantata/tenant/acme", dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    assert store.is_revoked(0xABC) is False
    store.revoke_certificate("abc")
    assert store.is_revoked(0xABC) is True
    with pytest.raises(RuntimeError), store.database.transaction():
        store.set_tenant_status("acme", "SUSPENDED", expect="APPROVED")
        raise RuntimeError("rolled back")
    assert store.tenant_status("acme") == "APPROVED"  # a change that never committed is never seen
    with store.database.transaction() as db:  # any writer, not only the store's own methods, clears the answers
        db.execute("UPDATE tenants SET status='SUSPENDED' WHERE name='acme'")
    assert store.tenant_status("acme") == "SUSPENDED"
