"""The server's one database: schema versions and migrations, file modes, one owner of the connection."""

import datetime as dt
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from cantata.proto.v1 import common_pb2
from cantata.security.keys import LocalKeyring, MasterKey
from cantata.server.database import MIGRATIONS, Database, DatabaseError, DatabaseUnavailable, disk_error
from cantata.server.datasource_store import DataSourceSpec, DataSourceStore
from cantata.server.store import RequestIdReused, Store
from tests.fullfs import fill, small_tmpfs

# The DDL both stores ran before the schema was versioned, copied as it was.
OLD_STORE_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY, status TEXT NOT NULL, csr_pem BLOB NOT NULL, csr_fingerprint TEXT NOT NULL,
    cert_pem BLOB, max_concurrent_jobs INTEGER NOT NULL DEFAULT 0, max_workers_per_job INTEGER NOT NULL DEFAULT 0,
    max_total_steps INTEGER NOT NULL DEFAULT 0, requested_at TEXT NOT NULL, approved_by TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS rejected_fingerprints (
    fingerprint TEXT PRIMARY KEY, name TEXT NOT NULL, rejected_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS certificates (
    serial TEXT PRIMARY KEY, principal TEXT NOT NULL, not_after TEXT NOT NULL, revoked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, request_id TEXT NOT NULL, spec BLOB NOT NULL, state INTEGER NOT NULL,
    reason TEXT NOT NULL DEFAULT '', step INTEGER NOT NULL DEFAULT 0, loss REAL NOT NULL DEFAULT 0,
    val_loss REAL NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, attack TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, UNIQUE (tenant, request_id)
);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, created_at);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS workers (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, pid INTEGER NOT NULL, finished INTEGER NOT NULL DEFAULT 0,
    failure TEXT NOT NULL DEFAULT '', restarts INTEGER NOT NULL DEFAULT 0, gossip_address TEXT NOT NULL DEFAULT '',
    round INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS anomalies (
    job_id TEXT NOT NULL, reporter INTEGER NOT NULL, peer INTEGER NOT NULL, round INTEGER NOT NULL,
    check_name TEXT NOT NULL, verdict TEXT NOT NULL, score REAL NOT NULL, quarantined INTEGER NOT NULL,
    time TEXT NOT NULL
);
"""
OLD_DATA_SOURCES_SCHEMA = """
CREATE TABLE IF NOT EXISTS data_sources (
    tenant TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, endpoint TEXT NOT NULL,
    has_dataset_key INTEGER NOT NULL, sealed BLOB NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (tenant, name)
);
"""
S3_SECRETS = {"access_key_id": "AKIAEXAMPLE", "secret_access_key": "not-a-real-secret"}


@pytest.fixture
def keyring(tmp_path: Path) -> LocalKeyring:
    ring = LocalKeyring(tmp_path / "keyring.sealed", MasterKey(bytes(range(32))))
    ring.ensure_tenant("acme")
    return ring


def _tables(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as raw:
        return {name: sql for name, sql in raw.execute("SELECT name, sql FROM sqlite_master WHERE type='table'")}


def _approved(store: Store) -> None:
    store.add_tenancy_request("acme", b"csr", "sha256:x")
    store.approve_tenant("acme", "sha256:x", b"cert", common_pb2.Quota(max_concurrent_jobs=2), "root")


def test_a_new_database_has_every_table_at_the_latest_version(tmp_path: Path) -> None:
    db = Database(tmp_path / "state.db")
    assert db.version == len(MIGRATIONS) >= 1
    db.close()
    assert {"tenants", "certificates", "jobs", "events", "workers", "anomalies", "data_sources"} <= set(
        _tables(tmp_path / "state.db")
    )


def _columns(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as raw:
        return {table: raw.execute(f"PRAGMA table_info({table})").fetchall() for table in _tables(path)}


def test_version_1_is_the_schema_of_the_unversioned_stores(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "old.db") as raw:
        raw.executescript(OLD_STORE_SCHEMA + OLD_DATA_SOURCES_SCHEMA)
    Database(tmp_path / "new.db", MIGRATIONS[:1]).close()
    assert _columns(tmp_path / "new.db") == _columns(tmp_path / "old.db")


def test_a_database_made_before_versioning_opens_unchanged(tmp_path: Path, keyring: LocalKeyring) -> None:
    path = tmp_path / "state.db"
    spec = common_pb2.JobSpec(name="j", steps=10)
    with sqlite3.connect(path) as raw:  # what the old server left: both schemas, user_version 0, rows in them
        raw.execute("PRAGMA journal_mode=WAL")
        raw.executescript(OLD_STORE_SCHEMA + OLD_DATA_SOURCES_SCHEMA)
        raw.execute(
            "INSERT INTO tenants (name, status, csr_pem, csr_fingerprint, max_concurrent_jobs, requested_at) "
            "VALUES ('acme', 'APPROVED', x'00', 'sha256:x', 2, '2026-01-01T00:00:00+00:00')"
        )
        raw.execute(
            "INSERT INTO jobs (id, tenant, request_id, spec, state, step, created_at, updated_at) "
            "VALUES ('job-1', 'acme', 'request-0001', ?, ?, 7, '2026-01-01', '2026-01-01')",
            (spec.SerializeToString(), common_pb2.RUNNING),
        )
    before = _tables(path)

    db = Database(path, MIGRATIONS[:1])
    assert db.version == 1
    assert _tables(path) == before  # nothing was recreated or altered
    db.close()

    db = Database(path)  # the later steps then apply to it
    assert db.version == len(MIGRATIONS)
    store, sources = Store(db), DataSourceStore(db, keyring)
    assert store.tenant("acme").quota.max_concurrent_jobs == 2
    job = store.job("job-1", tenant="acme")
    assert (job.state, job.step, job.spec) == (common_pb2.RUNNING, 7, spec)
    assert store.transition("job-1", common_pb2.SUCCEEDED)
    assert [e.state for e in store.events_after("job-1", 0)] == [common_pb2.SUCCEEDED]
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    assert [s.name for s in sources.sources("acme")] == ["corpus"]
    db.close()


def test_a_version_1_database_migrates_to_failure_counts_and_spec_digests(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    spec = common_pb2.JobSpec(name="j", steps=10)
    db = Database(path, MIGRATIONS[:1])
    db.connection.execute(  # a tenant as a version-1 server stored it: no requested_from or retention column
        "INSERT INTO tenants (name, status, csr_pem, csr_fingerprint, cert_pem, max_concurrent_jobs, requested_at) "
        "VALUES ('acme', 'APPROVED', x'00', 'sha256:x', x'00', 2, '2026-01-01')"
    )
    db.connection.execute(  # a job as a version-1 server stored it: no digest column
        "INSERT INTO jobs (id, tenant, request_id, spec, state, created_at, updated_at) "
        "VALUES ('job-1', 'acme', 'request-0001', ?, ?, '2026-01-01', '2026-01-01')",
        (spec.SerializeToString(), common_pb2.RUNNING),
    )
    db.close()

    db = Database(path)
    assert (
        db.version == len(MIGRATIONS) == 15
    )  # through the failures (2), digest (3), enrollment (4), tags/retention (5), metrics (6), queue index (7), max_gpus (8), adoption (9), submit record (10), parked jobs (11), last start (12), webhooks (13), fault (14), sweeps (15)
    store = Store(db)
    assert store.undo_unrecorded(0, {}) == []  # an old job's record was synced before its commit: never undone
    acme = store.tenant("acme")
    assert acme.retention_days == 0  # kept for ever, as before retention existed
    assert acme.quota.max_gpus == 0  # no GPU limit, as before GPUs were counted
    assert [j.id for j in store.jobs(tag="x")] == []  # the tag index exists and the old job has none
    assert store.submit_job(acme, "request-0001", spec, "digest-a")[0].id == "job-1"  # compared by its spec
    with pytest.raises(RequestIdReused, match="request-0001"):
        store.submit_job(acme, "request-0001", common_pb2.JobSpec(name="j", steps=11), "digest-a")
    job, created = store.submit_job(acme, "request-0002", spec, "digest-a")
    assert created and store.submit_job(acme, "request-0002", spec, "digest-a") == (job, False)
    with pytest.raises(RequestIdReused, match=job.id):  # a stored digest decides, whatever the defaults did
        store.submit_job(acme, "request-0002", spec, "digest-b")
    db.close()


def test_migrations_apply_in_order_once_each(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Database(path).close()
    steps = (*MIGRATIONS, "CREATE TABLE later (job_id TEXT)", "ALTER TABLE later ADD COLUMN step INTEGER")
    db = Database(path, steps)
    assert db.version == len(MIGRATIONS) + 2
    db.close()
    db = Database(path, steps)  # a second open applies nothing (CREATE TABLE would fail if it did)
    assert db.version == len(MIGRATIONS) + 2
    db.connection.execute("INSERT INTO later (job_id, step) VALUES ('j', 1)")
    db.close()


def test_a_failing_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Database(path).close()
    with pytest.raises(sqlite3.OperationalError):
        Database(path, (*MIGRATIONS, "CREATE TABLE half (x); ALTER TABLE missing ADD COLUMN y"))
    db = Database(path)
    assert db.version == len(MIGRATIONS)
    db.close()
    assert "half" not in _tables(path)


def test_a_database_newer_than_the_server_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Database(path, (*MIGRATIONS, "CREATE TABLE future (x)")).close()
    with pytest.raises(DatabaseError, match=f"schema version {len(MIGRATIONS) + 1};"):
        Database(path)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_database_files_are_readable_by_the_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    umask = os.umask(0)  # what a careless service manager might run the server with
    try:
        db = Database(path)
        store = Store(db)
        _approved(store)
        wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
        assert wal.exists() and shm.exists()
        assert (_mode(path), _mode(wal), _mode(shm)) == (0o600, 0o600, 0o600)
        db.close()
        with sqlite3.connect(path) as raw:  # a rollback journal, as a tool in another journal mode leaves one
            raw.execute("PRAGMA journal_mode=PERSIST")
            raw.execute("INSERT INTO rejected_fingerprints VALUES ('f', 'n', 't')")
        journal = Path(f"{path}-journal")
        assert journal.exists() and _mode(journal) == 0o600
    finally:
        os.umask(umask)


def test_a_database_left_world_readable_is_tightened_on_open(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Database(path).close()
    path.chmod(0o644)
    Path(f"{path}-wal").write_bytes(b"")
    Path(f"{path}-wal").chmod(0o644)
    Database(path).close()
    assert _mode(path) == 0o600
    assert not Path(f"{path}-wal").exists() or _mode(Path(f"{path}-wal")) == 0o600


def _open_files(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc")
def test_the_stores_share_the_one_connection_of_the_database(tmp_path: Path, keyring: LocalKeyring) -> None:
    path = tmp_path / "state.db"
    db = Database(path)
    store, sources = Store(db), DataSourceStore(db, keyring)
    _approved(store)
    sources.register("acme", DataSourceSpec("corpus", "s3", "", S3_SECRETS))
    assert store.database is sources.database is db
    assert _open_files(path) == 1  # one connection holds the file, however many stores use it
    with db.transaction() as tx:  # and one lock: a store's read inside the owner's transaction sees its write
        tx.execute("UPDATE tenants SET status='SUSPENDED' WHERE name='acme'")
        assert store.tenant_status("acme") == "SUSPENDED"
        assert sources.exists("acme", "corpus")
    db.close()
    assert _open_files(path) == 0


def test_a_version_3_database_gains_request_sources_and_renewal_links(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = Database(path, MIGRATIONS[:3])
    db.connection.execute(  # as a version-3 server stored them
        "INSERT INTO tenants (name, status, csr_pem, csr_fingerprint, requested_at) "
        "VALUES ('old-co', 'PENDING', x'00', 'sha256:x', '2026-01-01T00:00:00.000+00:00')"
    )
    db.connection.execute("INSERT INTO certificates (serial, principal, not_after) VALUES ('a1', 'p', 'later')")
    db.close()

    db = Database(path)
    assert (
        db.version == len(MIGRATIONS) == 15
    )  # every later step too (6: metrics, 7: queue index, 8: max_gpus, 9: worker adoption, 10: submit record, 11: parked jobs, 12: last start, 13: webhooks, 14: fault, 15: sweeps)
    store = Store(db)
    store.add_tenancy_request("new-co", b"csr", "sha256:y", source="203.0.113.7")
    seen: list[tuple[int, int]] = []
    store.add_tenancy_request("third-co", b"csr", "sha256:z", source="203.0.113.7", admit=lambda *n: seen.append(n))
    assert seen == [(2, 1)]  # the old request counts in all, under no address
    assert store.renewals_of("a1") == []
    assert store.revoke_certificate("a1") == "p" and store.is_revoked(0xA1)
    assert [t.name for t in store.expire_pending(dt.datetime(2026, 6, 1, tzinfo=dt.UTC))] == ["old-co"]
    db.close()


def test_a_full_disk_is_database_unavailable_changes_nothing_and_passes_once_there_is_space(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "data", size="2m") as data:
        database = Database(data / "state.db")
        try:
            with database.transaction() as connection:
                connection.execute("CREATE TABLE blobs (body BLOB NOT NULL)")
            filler = fill(data)
            full = pytest.raises(DatabaseUnavailable, match=r"database or disk is full \(SQLITE_FULL\)")
            with full, database.transaction() as connection:
                connection.execute("INSERT INTO blobs VALUES (?)", (os.urandom(256 * 1024),))
            with database.read() as reader:
                assert reader.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0
            filler.unlink()
            with database.transaction() as connection:
                connection.execute("INSERT INTO blobs VALUES (?)", (os.urandom(256 * 1024),))
            with database.read() as reader:
                assert reader.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 1
        finally:
            database.close()


def test_only_disk_errors_are_database_unavailable() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode, full.sqlite_errorname = sqlite3.SQLITE_FULL, "SQLITE_FULL"
    write = sqlite3.OperationalError("disk I/O error")
    write.sqlite_errorcode, write.sqlite_errorname = sqlite3.SQLITE_IOERR_WRITE, "SQLITE_IOERR_WRITE"
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode, locked.sqlite_errorname = sqlite3.SQLITE_BUSY, "SQLITE_BUSY"
    assert (
        str(disk_error(full)) == "the control-plane database cannot be written: database or disk is full (SQLITE_FULL)"
    )
    assert "disk I/O error (SQLITE_IOERR_WRITE)" in str(disk_error(write))
    assert disk_error(locked) is None and disk_error(ValueError("full")) is None
