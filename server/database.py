"""The control plane's one database: the SQLite file ``D/state.db``, its connection and its schema version.

One :class:`Database` owns the file's one writing connection in the server
process (WAL mode), the lock that serialises writes, and the transactions of
every store built on it (:class:`~cantata.server.store.Store`,
:class:`~cantata.server.datasource_store.DataSourceStore`). The schema is
versioned with ``PRAGMA user_version``: :data:`MIGRATIONS` is the ordered
history, and opening a file applies the steps it has not had yet, each in its
own transaction with its version number. Version 1 is the schema the stores
created before it was versioned, so such a file opens unchanged. A later
PostgreSQL store offers the same stores on another database of this shape.

Durability is group commit: a commit writes its WAL frames without a sync
(synchronous=NORMAL) and releases the lock, then waits until one
``fdatasync`` of the WAL that started after it has finished; the first waiter
runs it for every commit so far, so concurrent writers share one sync and no
writer waits on another's sync while holding the lock. A transaction returns
only once its commit is durable. Reads do not wait on writers: each thread
reads committed state through a connection of its own (:meth:`Database.read`),
except inside its own write transaction, whose changes it reads.

The file and its ``-wal``, ``-shm`` and ``-journal`` companions (which SQLite
creates with the database file's mode) are readable by the owner only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
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

# 4: where each tenancy request came from (the per-address cap on pending requests), and which certificate
# each one renewed (revoking a certificate revokes its renewals). Rows made before it keep ''.
_V4_ENROLLMENT_AND_RENEWALS = """
ALTER TABLE tenants ADD COLUMN requested_from TEXT NOT NULL DEFAULT '';
ALTER TABLE certificates ADD COLUMN renewed_from TEXT NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS certificates_by_predecessor ON certificates (renewed_from);
"""

# 5: jobs' tags, indexed for `jobs list --tag`, and each tenant's retention of ended jobs (0: kept for ever).
_V5_TAGS_RETENTION = """
CREATE TABLE job_tags (
    job_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (job_id, tag)
);
CREATE INDEX job_tags_by_tag ON job_tags (tag, job_id);
ALTER TABLE tenants ADD COLUMN retention_days INTEGER NOT NULL DEFAULT 0;
"""
_V8_MAX_GPUS = "ALTER TABLE tenants ADD COLUMN max_gpus INTEGER NOT NULL DEFAULT 0"

# 6 (branch metrics21): each job's metrics history (server/metrics_store.py); peer -1 is "not per peer".
_V6_METRICS = """
CREATE TABLE metrics (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    name TEXT NOT NULL,
    worker INTEGER NOT NULL,
    peer INTEGER NOT NULL,
    step INTEGER NOT NULL,
    time REAL NOT NULL,
    value REAL
);
CREATE INDEX metrics_by_job ON metrics (job_id, seq);
CREATE INDEX metrics_by_series ON metrics (job_id, name, worker, peer, step);
"""
# 7 (branch perf16): the jobs of each state by tenant in queue order, so the scheduler's look at the queue's heads
# (each tenant's oldest queued job) and at each tenant's active jobs seeks instead of scanning the queue.
_V7_QUEUE_INDEX = "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, tenant, created_at, id)"

# 9 (branch restart18): each worker's process start time (clock ticks since boot, /proc/<pid>/stat), so that a restarted
# server re-adopts a worker by pid and start time and never a process that reused its pid; and the sequence
# number of the last report applied from it, so that a report sent again after an outage is applied once.
_V9_WORKER_ADOPTION = """
ALTER TABLE workers ADD COLUMN started_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
"""

# 10 (branch perf16): the audit seq of each job's job_submitted record. A submit's audit record and its commit are
# synced side by side, so a crash between them can leave a job whose record was lost: the server, on start, undoes
# the jobs whose record is not in the audit log (jobs made before it keep 0: their records were synced first).
_V10_SUBMIT_RECORD = """
ALTER TABLE jobs ADD COLUMN audit_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_by_audit_seq ON jobs (audit_seq) WHERE audit_seq > 0;
"""

# 11 (branch perf16b): queued jobs the executor can never run as it is are parked, so that the scheduler's look at the
# queue's heads passes them in the index (jobs_queue: the unparked queued jobs by tenant in queue order) instead of
# skipping them one by one; a look costs the same whatever their number. Rows made before it are unparked (0).
# And each tenant's unfinished jobs (QUEUED 1, STARTING 2, RUNNING 3, CANCELLING 4: the concurrent-jobs quota)
# are counted by triggers as jobs change, so a submit reads one row instead of counting the tenant's queue.
_V11_PARKED = """
ALTER TABLE jobs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_queue ON jobs (tenant, created_at) WHERE state = 1 AND parked = 0;
CREATE INDEX jobs_parked ON jobs (reason) WHERE state = 1 AND parked = 1;
CREATE TABLE unfinished_jobs (tenant TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO unfinished_jobs SELECT tenant, COUNT(*) FROM jobs WHERE state IN (1, 2, 3, 4) GROUP BY tenant;
CREATE TRIGGER unfinished_on_insert AFTER INSERT ON jobs WHEN new.state IN (1, 2, 3, 4) BEGIN
    INSERT INTO unfinished_jobs (tenant, n) VALUES (new.tenant, 1) ON CONFLICT (tenant) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER unfinished_on_delete AFTER DELETE ON jobs WHEN old.state IN (1, 2, 3, 4) BEGIN
    UPDATE unfinished_jobs SET n = n - 1 WHERE tenant = old.tenant;
END;
CREATE TRIGGER unfinished_on_update AFTER UPDATE OF state, tenant ON jobs
WHEN (old.state IN (1, 2, 3, 4)) != (new.state IN (1, 2, 3, 4)) OR old.tenant != new.tenant BEGIN
    UPDATE unfinished_jobs SET n = n - 1 WHERE tenant = old.tenant AND old.state IN (1, 2, 3, 4);
    INSERT INTO unfinished_jobs (tenant, n) SELECT new.tenant, 1 WHERE new.state IN (1, 2, 3, 4)
    ON CONFLICT (tenant) DO UPDATE SET n = n + 1;
END;
"""

# 12 (branch fair): each tenant's latest job start, as a counter every start bumps (a trigger, so every way a job
# starts counts), so the scheduler gives the next start to the tenant that started least recently
# (:mod:`cantata.server.jobs.fairness`); the index makes the counter's maximum a seek. Tenants keep 0: none yet.
_V12_LAST_START = """
ALTER TABLE tenants ADD COLUMN last_start INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tenants_by_last_start ON tenants (last_start);
CREATE TRIGGER tenant_last_start AFTER UPDATE OF state ON jobs WHEN new.state = 2 AND old.state != 2 BEGIN
    UPDATE tenants SET last_start = (SELECT MAX(last_start) FROM tenants) + 1 WHERE name = new.tenant;
END;
"""

# 13: tenants' webhook endpoints (signing secret sealed under the tenant's key), the
# deliveries of each event to each endpoint (the outbox the deliverer works through, in the transaction that
# wrote the event) and every attempt of each (:mod:`cantata.server.webhooks.store`).
_V13_WEBHOOKS = """
CREATE TABLE webhook_endpoints (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    url TEXT NOT NULL,
    event_types TEXT NOT NULL,
    description TEXT NOT NULL,
    sealed BLOB NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX webhook_endpoints_by_tenant ON webhook_endpoints (tenant);
CREATE TABLE webhook_deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    job_id TEXT NOT NULL,
    body BLOB NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_status INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (endpoint_id, id);
CREATE TABLE webhook_attempts (
    delivery_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at TEXT NOT NULL,
    status INTEGER NOT NULL,
    error TEXT NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
"""

# 14: an admin's planned fault (cantata.proto.faults, JSON; '': none), evaluation only, like attack.
_V14_FAULT = "ALTER TABLE jobs ADD COLUMN fault TEXT NOT NULL DEFAULT ''"

# 15: sweeps (:mod:`cantata.server.sweeps.store`).
_V15_SWEEPS = """
CREATE TABLE sweeps (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    request_id TEXT NOT NULL,
    spec BLOB NOT NULL,
    state INTEGER NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    active INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (tenant, request_id)
);
CREATE INDEX sweeps_active ON sweeps (active) WHERE active = 1;
"""

# MIGRATIONS[n] takes a database from version n to n + 1. Append; never edit a step that has shipped.
MIGRATIONS: tuple[str, ...] = (
    _V1_STORE + _V1_DATA_SOURCES,  # 1: the unversioned schema of the store and the data sources, as it was
    "ALTER TABLE jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",  # 2: worker failures a job survived
    _V3_SPEC_DIGEST,  # 3: jobs.spec_digest
    _V4_ENROLLMENT_AND_RENEWALS,  # 4: tenants.requested_from, certificates.renewed_from
    _V5_TAGS_RETENTION,  # 5: job_tags, tenants.retention_days
    _V6_METRICS,  # 6: metrics
    _V7_QUEUE_INDEX,  # 7: jobs_by_state
    _V8_MAX_GPUS,  # 8: tenants.max_gpus
    _V9_WORKER_ADOPTION,  # 9: workers.started_at, workers.last_seq
    _V10_SUBMIT_RECORD,  # 10: jobs.audit_seq
    _V11_PARKED,  # 11: jobs.parked, jobs_queue, jobs_parked, unfinished_jobs
    _V12_LAST_START,  # 12: tenants.last_start, tenants_by_last_start, tenant_last_start
    _V13_WEBHOOKS,  # 13: webhook_endpoints, webhook_deliveries, webhook_attempts
    _V14_FAULT,  # 14: jobs.fault
    _V15_SWEEPS,  # 15: sweeps
)


class DatabaseError(Exception):
    """The database file cannot be used by this server (for instance, its schema is newer than the server)."""


class DatabaseUnavailable(Exception):
    """The database cannot be written now: its disk is full or failed (SQLite's ``SQLITE_FULL`` or ``SQLITE_IOERR``).

    The statement or transaction that met it was rolled back: nothing of it happened, and the same request may be
    sent again once there is space (the server serves it as ``UNAVAILABLE``).
    """


# SQLite's primary result codes (the low byte of an extended one) that mean the disk, not the request, is at fault.
_DISK_ERRORS = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR}


def disk_error(exc: BaseException) -> DatabaseUnavailable | None:
    """``exc`` as :class:`DatabaseUnavailable` if it is SQLite's full-disk or I/O error, else None."""
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(exc, sqlite3.Error) or code is None or code & 0xFF not in _DISK_ERRORS:
        return None
    name = getattr(exc, "sqlite_errorname", "") or "SQLITE_FULL"
    return DatabaseUnavailable(f"the control-plane database cannot be written: {exc} ({name})")


@contextmanager
def _disk_errors_unavailable() -> Iterator[None]:
    """Raise SQLite's full-disk and I/O errors met inside as :class:`DatabaseUnavailable`."""
    try:
        yield
    except sqlite3.Error as exc:
        unavailable = disk_error(exc)
        if unavailable is None:
            raise
        raise unavailable from exc


class Database:
    """The SQLite file, its writing connection, the lock every store on it shares, and per-thread readers."""

    def __init__(self, path: Path, migrations: Sequence[str] = MIGRATIONS):
        self.path = Path(path)
        _make_private(self.path)
        self.connection = _connect(self.path)
        self.lock = threading.RLock()
        self._batch: _Batch | None = None  # the open SQLite transaction that concurrent transactions share
        self._batch_done = threading.Condition(self.lock)
        self._barriers: list[Callable[[], None]] = []  # of the member whose body runs now
        self._alongside: list[tuple[Callable[[], None], Callable[[], None]]] = []  # (wait, undo), likewise
        self._side_syncs: ThreadPoolExecutor | None = None  # runs alongside waits while a member syncs the WAL
        self._every_commit: list[Callable[[], None]] = []  # after each transaction that commits
        self._changed_tables: dict[str, list[Callable[[], None]]] = {}  # table -> hooks after a commit changing it
        self._changed_tables_now: set[str] = set()  # tables the open transaction changed
        self._awaiting_sync: deque[tuple[int, list[_Member]]] = deque()  # hooks of unsynced commits
        self._durable_lock = threading.Lock()
        self._writer: int | None = None  # the thread whose write transaction is open
        self._readers = threading.local()
        self._all_readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._commits = self._synced = 0  # commits made, and how many of them a finished sync covered
        self._sync_cv = threading.Condition(threading.Lock())
        self._syncing = False
        self._wal_fd: int | None = None
        try:
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")  # migrations commit synced
            self._migrate(migrations)
            self.connection.execute("PRAGMA synchronous=NORMAL")  # from now on, _await_synced syncs commits
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
        """One write transaction (see :meth:`_transaction`); a full or failing disk raises :class:`DatabaseUnavailable`."""
        with _disk_errors_unavailable(), self._transaction() as connection:
            yield connection

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed (and synced) before it returns, rolled back on an exception.

        Concurrent transactions share one SQLite transaction (a batch, group
        commit): each runs its body in turn under :attr:`lock`, as a savepoint
        of the batch that its own exception undoes alone, then runs its
        :meth:`before_commit` barriers outside the lock, so others write
        meanwhile; once every member is through, the last one commits the
        batch. A barrier that raises rolls the whole batch back, and every
        member raises. That is how an act is held until its audit record is
        durable without holding the lock across the audit log's sync: the
        record is written in the body and its sync is a barrier, shared by
        the batch.

        Inside another one on the same thread it is a savepoint of it: its
        changes are undone on its own exception, and are kept only if the
        outer transaction commits.
        """
        me = threading.get_ident()
        with self.lock:
            if self._writer == me:
                yield from self._nested()
                return
            batch = self._join()
            hooks = len(batch.hooks)
            self.connection.execute("SAVEPOINT member")
            self._writer, self._barriers, self._alongside = me, [], []
            try:
                yield self.connection
            except BaseException:
                self._writer = None
                self.connection.execute("ROLLBACK TO member")
                self.connection.execute("RELEASE member")
                del batch.hooks[hooks:]
                self._leave(batch, None, joined=False)
                raise
            self._writer = None
            self.connection.execute("RELEASE member")
            barriers, self._barriers = self._barriers, []
            alongside, self._alongside = self._alongside, []
            mine = _Member(batch.hooks[hooks:], pending=bool(alongside))
            del batch.hooks[hooks:]
            batch.through.append(mine)
        failure: BaseException | None = None
        for barrier in barriers:
            try:
                barrier()
            except BaseException as exc:
                failure = exc
                break
        with self.lock:
            self._leave(batch, failure, joined=True)
            while not batch.done:
                self._batch_done.wait()
        if batch.failure is not None:
            if batch.failure is failure:
                raise failure
            raise _again(batch.failure) from batch.failure
        if not alongside:
            self._await_synced(batch.commit)
            self._run_durable_hooks()
            return
        self._synced_alongside(batch.commit, mine, alongside)

    def _synced_alongside(
        self, commit: int, mine: _Member, alongside: list[tuple[Callable[[], None], Callable[[], None]]]
    ) -> None:
        """Sync the WAL here while the alongside waits run on a helper thread; undo the commit if one fails."""
        waits = self._side_pool().submit(lambda: [wait() for wait, _ in alongside])
        wal_failure: BaseException | None = None
        try:
            self._await_synced(commit)
        except BaseException as exc:
            wal_failure = exc
        failed = waits.exception()
        with self._durable_lock:
            mine.pending, mine.dropped = False, failed is not None
        self._run_durable_hooks()
        if failed is not None:
            for _, undo in reversed(alongside):
                undo()
            raise failed
        if wal_failure is not None:
            raise wal_failure

    def _side_pool(self) -> ThreadPoolExecutor:
        with self._durable_lock:
            if self._side_syncs is None:
                self._side_syncs = ThreadPoolExecutor(8, thread_name_prefix="db-alongside")
            return self._side_syncs

    def _nested(self) -> Iterator[sqlite3.Connection]:
        assert self._batch is not None
        self.connection.execute("SAVEPOINT nested")
        hooks, alongside = len(self._batch.hooks), len(self._alongside)
        try:
            yield self.connection
        except BaseException:
            self.connection.execute("ROLLBACK TO nested")
            self.connection.execute("RELEASE nested")
            del self._batch.hooks[hooks:]
            del self._alongside[alongside:]
            raise
        self.connection.execute("RELEASE nested")

    def _join(self) -> _Batch:
        """The open batch, joined (a new one if none is open; after the one closing now). Under the lock."""
        while self._batch is not None and self._batch.closed:
            self._batch_done.wait()
        if self._batch is None:
            self.connection.execute("BEGIN IMMEDIATE")
            self._batch = _Batch()
        self._batch.members += 1
        return self._batch

    def _leave(self, batch: _Batch, failure: BaseException | None, *, joined: bool) -> None:
        """A member is through (its body, and if ``joined`` its barriers); the last one ends the batch. Under the lock.

        The batch closes to newcomers once a member is through its barriers: the members still in it
        are bounded, so it commits.
        """
        batch.members -= 1
        batch.transactions += joined
        if joined:
            batch.closed = True
        if failure is not None and batch.failure is None:
            batch.failure = failure
        if batch.members:
            return
        self._batch = None
        try:
            if batch.failure is not None or not batch.transactions:
                self.connection.execute("ROLLBACK")
                return
            try:
                self.connection.execute("COMMIT")
            except BaseException as exc:
                if self.connection.in_transaction:
                    self.connection.execute("ROLLBACK")
                batch.failure = disk_error(exc) or exc  # every member raises it: a type they can be given again
                return
            self._commits += batch.transactions
            batch.commit = self._commits
            for hook in self._every_commit:
                hook()
            if any(m.hooks or m.pending for m in batch.through):
                with self._durable_lock:
                    self._awaiting_sync.append((batch.commit, batch.through))
        finally:
            self._run_change_hooks()  # after a rollback too: a cache may hold what the transaction read of its own
            batch.done = True
            self._batch_done.notify_all()

    def before_commit(self, barrier: Callable[[], None]) -> None:
        """Run ``barrier`` after this thread's transaction body, outside the lock, before its batch commits.

        If it raises, the batch rolls back and every transaction in it raises (the first with its exception).
        """
        assert self._writer == threading.get_ident(), "before_commit outside this thread's transaction"
        self._barriers.append(barrier)

    def alongside_commit(self, wait: Callable[[], None], undo: Callable[[], None]) -> None:
        """Run ``wait`` (another file's sync) once this thread's transaction committed, alongside its WAL sync.

        The transaction returns once both finished: one sync's time, not two. If ``wait`` raises, the commit
        stands, so ``undo`` (a transaction of its own) reverses it, the transaction's ``after_commit`` hooks
        are dropped, and it raises ``wait``'s exception. A crash between the two syncs is for whoever calls
        this to reconcile on start.
        """
        assert self._writer == threading.get_ident(), "alongside_commit outside this thread's transaction"
        self._alongside.append((wait, undo))

    def writing(self) -> bool:
        """Whether this thread is in the body of a write transaction."""
        return self._writer == threading.get_ident()

    def _run_durable_hooks(self) -> None:
        """Run the ``after_commit`` hooks of every synced commit, in commit order (whichever thread gets here).

        A batch's hooks wait until every alongside wait of its members has finished; a member whose wait failed
        has its hooks dropped.
        """
        with self._durable_lock:
            while self._awaiting_sync and self._awaiting_sync[0][0] <= self._synced:
                members = self._awaiting_sync[0][1]
                if any(m.pending for m in members):
                    return
                self._awaiting_sync.popleft()
                for member in members:
                    if not member.dropped:
                        for hook in member.hooks:
                            hook()

    def _await_synced(self, commit: int) -> None:
        """Return once a WAL sync that started after ``commit`` was written has finished (group commit)."""
        with self._sync_cv:
            while self._synced < commit:
                if not self._syncing:
                    self._syncing = True
                    break
                self._sync_cv.wait()
            else:
                return
        try:
            target = self._commits  # every commit counted here has written its frames
            os.fdatasync(self._wal())
            with self._sync_cv:
                self._synced = max(self._synced, target)
        except OSError as exc:
            raise DatabaseError(f"{self.path}: the write-ahead log cannot be synced: {exc.strerror or exc}") from exc
        finally:
            with self._sync_cv:
                self._syncing = False
                self._sync_cv.notify_all()

    def _wal(self) -> int:
        if self._wal_fd is None:
            self._wal_fd = os.open(self.path.with_name(self.path.name + "-wal"), os.O_RDONLY)
        return self._wal_fd

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A connection to read committed state through, without waiting on writers.

        This thread's own reader, or, inside this thread's write transaction, the writing
        connection (so the transaction reads its own changes).
        """
        if self._writer == threading.get_ident():
            with self.lock:
                yield self.connection
            return
        with _disk_errors_unavailable():
            yield self._reader()

    def _reader(self) -> sqlite3.Connection:
        reader = getattr(self._readers, "connection", None)
        if reader is None:
            reader = _connect(self.path)
            reader.execute("PRAGMA query_only=ON")
            self._readers.connection = reader
            with self._readers_lock:
                self._all_readers.append(reader)
        return reader

    def on_every_commit(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` after every transaction that commits (under the lock, at once: readers see it at once)."""
        self._every_commit.append(hook)

    def on_commit_changing(self, table: str, hook: Callable[[], None]) -> None:
        """Run ``hook`` after every commit that changed a row of ``table`` (under the lock, at once), whoever wrote it.

        Triggers on the writing connection note the change as it is made, so a cache of the table's rows is
        emptied only when they changed, not at every commit. A transaction that changed it and rolled back runs
        it too (a cache may hold what the transaction read of its own changes).
        """
        with self.lock:
            if not self._changed_tables:
                self.connection.create_function("cantata_changed", 1, self._note_change)
            self._changed_tables.setdefault(table, []).append(hook)
            for op in ("INSERT", "UPDATE", "DELETE"):
                self.connection.execute(
                    f"CREATE TEMP TRIGGER IF NOT EXISTS cantata_{table}_{op.lower()} AFTER {op} ON main.{table} "
                    f"BEGIN SELECT cantata_changed('{table}'); END"
                )

    def _note_change(self, table: str) -> None:
        self._changed_tables_now.add(table)

    def _run_change_hooks(self) -> None:
        changed, self._changed_tables_now = self._changed_tables_now, set()
        for table in changed:
            for hook in self._changed_tables.get(table, ()):
                hook()

    def after_commit(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once the open transaction's commit is synced (dropped if it, or its savepoint, rolls back).

        Hooks run in commit order, so a job's events reach its watchers in order, and only once durable.
        """
        assert self._batch is not None and self._writer == threading.get_ident(), "after_commit outside a transaction"
        self._batch.hooks.append(hook)

    def close(self) -> None:
        with self.lock:
            self.connection.close()
            with self._readers_lock:
                for reader in self._all_readers:
                    reader.close()
            if self._wal_fd is not None:
                os.close(self._wal_fd)
        if self._side_syncs is not None:
            self._side_syncs.shutdown()


@dataclass(eq=False)
class _Member:
    """One transaction of a batch: its ``after_commit`` hooks, held while its alongside waits run."""

    hooks: list[Callable[[], None]]
    pending: bool = False  # an alongside wait still runs
    dropped: bool = False  # an alongside wait failed: the hooks are not run


@dataclass(eq=False)
class _Batch:
    """Concurrent transactions sharing one SQLite transaction, committed together."""

    members: int = 0  # joined and not yet through
    transactions: int = 0  # members through their body and barriers (to commit)
    closed: bool = False  # no newcomers
    done: bool = False
    failure: BaseException | None = None
    commit: int = 0  # the number of its last transaction, once committed
    hooks: list[Callable[[], None]] = field(default_factory=list)  # after_commit hooks of the body running now
    through: list[_Member] = field(default_factory=list)  # the members through their body, in order, with their hooks


def _again(exc: BaseException) -> BaseException:
    """An exception like ``exc`` for another member of its batch (the same type where it can be rebuilt)."""
    try:
        return type(exc)(*exc.args)
    except Exception:
        return RuntimeError(f"the transaction's batch was rolled back: {exc}")


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    connection.row_factory = sqlite3.Row
    connection.execute("PRAGMA busy_timeout=5000")
    return connection


def _make_private(path: Path) -> None:
    """Create the database file with mode 0600 (its companions inherit it); tighten files left wider."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, *(path.with_name(path.name + suffix) for suffix in SIDECARS)):
        if name.exists():
            name.chmod(0o600)
