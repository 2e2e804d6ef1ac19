"""The control plane's one database: the SQLite file ``D/state.db``, its connection and its schema version.

One :class:`Database` owns the file's only connection in the server process
(WAL mode, synchronous=FULL), the lock that serialises its use, and the
transactions of every store built on it (:class:`~cantata.server.store.Store`,
:class:`~cantata.server.datasource_store.DataSourceStore`). The schema is
versioned with ``PRAGMA user_version``: :data:`MIGRATIONS` is the ordered
history, and opening a file applies the steps it has not had yet, each in its
own transaction with its version number. Version 1 is the schema the stores
created before it was versioned, so such a file opens unchanged. A later
PostgreSQL store offers the same stores on another database of this shape.

The file and its ``-wal``, ``-shm`` and ``-journal`` companions (which SQLite
creates with the database file's mode) are readable by the owner only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

SIDECARS = ("-wal", "-shm", "-journal")

_V1_STORE = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    csr_pem BLOB NOT NULL,
    csr_fingerprint TEXT NOT NULL,
    cert_pem BLOB,
    max_concurrent_jobs INTEGER NOT NULL DEFAULT 0,
    max_workers_per_job INTEGER NOT NULL DEFAULT 0,
    max_total_steps INTEGER NOT NULL DEFAULT 0,
    requested_at TEXT NOT NULL,
    approved_by TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS rejected_fingerprints (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    rejected_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS certificates (
    serial TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    not_after TEXT NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    request_id TEXT NOT NULL,
    spec BLOB NOT NULL,
    state INTEGER NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    step INTEGER NOT NULL DEFAULT 0,
    loss REAL NOT NULL DEFAULT 0,
    val_loss REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    attack TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (tenant, request_id)
);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, created_at);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS workers (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    failure TEXT NOT NULL DEFAULT '',
    restarts INTEGER NOT NULL DEFAULT 0,
    gossip_address TEXT NOT NULL DEFAULT '',
    round INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS anomalies (
    job_id TEXT NOT NULL,
    reporter INTEGER NOT NULL,
    peer INTEGER NOT NULL,
    round INTEGER NOT NULL,
    check_name TEXT NOT NULL,
    verdict TEXT NOT NULL,
    score REAL NOT NULL,
    quarantined INTEGER NOT NULL,
    time TEXT NOT NULL
);
"""
_V1_DATA_SOURCES = """
CREATE TABLE IF NOT EXISTS data_sources (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    has_dataset_key INTEGER NOT NULL,
    sealed BLOB NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);
"""

# 3: the digest of each job's spec as submitted, so a reused request id with another spec is refused.
# Jobs made before it keep '' and are compared by their stored spec.
_V3_SPEC_DIGEST = "ALTER TABLE jobs ADD COLUMN spec_digest TEXT NOT NULL DEFAULT ''"

# 4: jobs' tags, indexed for `jobs list --tag`, and each tenant's retention of ended jobs (0: kept for ever).
_V4_TAGS_RETENTION = """
CREATE TABLE job_tags (
    job_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (job_id, tag)
);
CREATE INDEX job_tags_by_tag ON job_tags (tag, job_id);
ALTER TABLE tenants ADD COLUMN retention_days INTEGER NOT NULL DEFAULT 0;
"""

# MIGRATIONS[n] takes a database from version n to n + 1. Append; never edit a step that has shipped.
MIGRATIONS: tuple[str, ...] = (
    _V1_STORE + _V1_DATA_SOURCES,  # 1: the unversioned schema of the store and the data sources, as it was
    "ALTER TABLE jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",  # 2: worker failures a job survived
    _V3_SPEC_DIGEST,  # 3: jobs.spec_digest
    _V4_TAGS_RETENTION,  # 4: job_tags, tenants.retention_days
)


class DatabaseError(Exception):
    """The database file cannot be used by this server (for instance, its schema is newer than the server)."""


class Database:
    """The SQLite file, its one connection, and the lock every store on it shares."""

    def __init__(self, path: Path, migrations: Sequence[str] = MIGRATIONS):
        self.path = Path(path)
        _make_private(self.path)
        self.connection = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self.connection.row_factory = sqlite3.Row
        self.lock = threading.RLock()
        try:
            self.connection.execute("PRAGMA busy_timeout=5000")
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")
            self._migrate(migrations)
        except BaseException:
            self.connection.close()
            raise

    @property
    def version(self) -> int:
        """The schema version of the file (``PRAGMA user_version``)."""
        with self.lock:
            return int(self.connection.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self, migrations: Sequence[str]) -> None:
        current = self.version
        if current > len(migrations):
            raise DatabaseError(
                f"{self.path} has schema version {current}; this server knows versions up to {len(migrations)}"
            )
        for version, script in enumerate(migrations[current:], start=current + 1):
            try:
                self.connection.executescript(f"BEGIN IMMEDIATE;\n{script};\nPRAGMA user_version={version};\nCOMMIT;")
            except BaseException:
                if self.connection.in_transaction:
                    self.connection.execute("ROLLBACK")
                raise

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): committed on exit, rolled back on an exception.

        Inside another one on the same thread it is a savepoint of it: its
        changes are undone on its own exception, and are kept only if the
        outer transaction commits. That is how an act is held until its audit
        record is durable: the act's store writes and the append go in one
        outer transaction, so an append that fails leaves nothing behind.
        """
        with self.lock:
            if self.connection.in_transaction:
                self.connection.execute("SAVEPOINT nested")
                try:
                    yield self.connection
                except BaseException:
                    self.connection.execute("ROLLBACK TO nested")
                    self.connection.execute("RELEASE nested")
                    raise
                self.connection.execute("RELEASE nested")
                return
            self.connection.execute("BEGIN IMMEDIATE")
            try:
                yield self.connection
            except BaseException:
                self.connection.execute("ROLLBACK")
                raise
            self.connection.execute("COMMIT")

    def close(self) -> None:
        with self.lock:
            self.connection.close()


def _make_private(path: Path) -> None:
    """Create the database file with mode 0600 (its companions inherit it); tighten files left wider."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, *(path.with_name(path.name + suffix) for suffix in SIDECARS)):
        if name.exists():
            name.chmod(0o600)
