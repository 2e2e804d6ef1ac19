"""The control plane's durable state, one repository per aggregate, composed by :class:`Store`.

Every repository works on the server's one :class:`~cantata.server.database.Database` (its connection, lock,
schema and transactions, which nest): :mod:`~.tenants`, :mod:`~.certificates`, :mod:`~.jobs`, :mod:`~.queue`,
:mod:`~.events`, :mod:`~.workers`, :mod:`~.anomalies` and :mod:`~.metrics`. Each writes only its own tables
(:class:`~.base.Repository`); what spans aggregates (a job's events written with its state, its rows deleted
with it) is one transaction in which the owning repositories each write theirs. Everything the server knows
survives a crash here.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from cantata.proto.v1 import jobs_pb2
from cantata.server.broadcast import EventBroadcast
from cantata.server.database import Database
from cantata.server.store.anomalies import Anomalies
from cantata.server.store.base import Signal
from cantata.server.store.certificates import Certificates
from cantata.server.store.errors import (
    Conflict,
    NotEnded,
    NotFound,
    NotResumable,
    QuotaExceeded,
    RequestIdReused,
    StoreError,
)
from cantata.server.store.events import Events
from cantata.server.store.jobs import UNFINISHED_OF_TENANT, Jobs
from cantata.server.store.metrics import MetricsStore
from cantata.server.store.queue import Queue, queue_head_query
from cantata.server.store.records import (
    ACTIVE,
    RESUMABLE,
    TRANSITIONS,
    AnomalyRecord,
    JobRecord,
    Tenant,
    WorkerRecord,
    utcnow,
)
from cantata.server.store.tenants import Tenants
from cantata.server.store.workers import Workers

__all__ = [
    "ACTIVE",
    "RESUMABLE",
    "TRANSITIONS",
    "UNFINISHED_OF_TENANT",
    "AnomalyRecord",
    "Conflict",
    "JobRecord",
    "NotEnded",
    "NotFound",
    "NotResumable",
    "QuotaExceeded",
    "RequestIdReused",
    "Store",
    "StoreError",
    "Tenant",
    "WorkerRecord",
    "queue_head_query",
    "utcnow",
]


class Store:
    """The platform's state on a database, with change notification for event streams.

    Given a path rather than the server's :class:`Database`, it opens a database of its own. Its repositories
    are its attributes (``store.jobs.get(job_id)``; calling ``store.jobs``, ``store.tenants``, ``store.workers``
    or ``store.anomalies`` lists). Its other names are those repositories' methods under the names callers
    knew before the split (``store.job`` is ``store.jobs.get``), so each is written once.
    """

    def __init__(self, database: Database | Path, broadcast: EventBroadcast | None = None):
        self.database = database if isinstance(database, Database) else Database(database)
        self._queue_changed = Signal()  # a job was queued, or a quota or tenant changed
        self.tenants = Tenants(self.database, self._queue_changed)
        self.certificates = Certificates(self.database)
        self.events = Events(self.database, broadcast, self._queue_changed)
        self.workers = Workers(self.database)
        self.anomalies = Anomalies(self.database)
        self.metrics = MetricsStore(self.database)
        self.jobs = Jobs(
            self.database,
            tenants=self.tenants,
            events=self.events,
            workers=self.workers,
            anomalies=self.anomalies,
            metrics=self.metrics,
            queue_changed=self._queue_changed,
        )
        self.queue = Queue(self.database, jobs=self.jobs, events=self.events, queue_changed=self._queue_changed)

        self.add_tenancy_request = self.tenants.request
        self.expire_pending = self.tenants.expire_pending
        self.tenant = self.tenants.get
        self.tenant_status = self.tenants.status
        self.approve_tenant = self.tenants.approve
        self.reject_tenant = self.tenants.reject
        self.set_quota = self.tenants.set_quota
        self.set_retention = self.tenants.set_retention
        self.set_tenant_certificate = self.tenants.set_certificate
        self.set_tenant_status = self.tenants.set_status

        self.record_certificate = self.certificates.record
        self.revoke_certificate = self.certificates.revoke
        self.renewals_of = self.certificates.renewals_of
        self.current_certificate = self.certificates.current
        self.is_revoked = self.certificates.is_revoked

        self.submit_job = self.jobs.submit
        self.settled = self.jobs.settled
        self.undo_submission = self.jobs.undo_submission
        self.undo_unrecorded = self.jobs.undo_unrecorded
        self.existing_jobs = self.jobs.existing
        self.check_quota = self.jobs.check_quota
        self.resume_job = self.jobs.resume
        self.job = self.jobs.get
        self.job_active = self.jobs.active
        self.job_counts = self.jobs.counts
        self.delete_job = self.jobs.delete
        self.expired_jobs = self.jobs.expired
        self.transition = self.jobs.transition
        self.record_progress = self.jobs.record_progress
        self.count_failure = self.jobs.count_failure
        self.set_attack = self.jobs.set_attack
        self.attack = self.jobs.attack
        self.set_fault = self.jobs.set_fault
        self.fault = self.jobs.fault

        self.queue_head = self.queue.head
        self.park = self.queue.park
        self.queued_after = self.queue.queued_after
        self.parked_verdicts = self.queue.parked_verdicts
        self.unpark = self.queue.unpark
        self.set_waiting = self.queue.set_waiting

        self.append_event = self.events.append
        self.events_after = self.events.after
        self.resumed_after = self.events.resumed_after
        self.latest_checkpoint_step = self.events.latest_checkpoint_step

        self.set_workers = self.workers.set
        self.restart_worker = self.workers.restart
        self.worker_relaunched = self.workers.relaunched
        self.claim_report = self.workers.claim_report
        self.set_round = self.workers.set_round
        self.rounds = self.workers.rounds
        self.latest_round = self.workers.latest_round
        self.set_gossip_address = self.workers.set_gossip_address
        self.mark_worker = self.workers.mark

        self.add_anomaly = self.anomalies.add

    @property
    def on_queue_change(self) -> Callable[[], None]:
        """Called once a job was queued, or a quota or tenant changed (the scheduler's wake-up)."""
        return self._queue_changed.receiver

    @on_queue_change.setter
    def on_queue_change(self, receiver: Callable[[], None]) -> None:
        self._queue_changed.receiver = receiver

    @property
    def on_event(self) -> Callable[[sqlite3.Connection, str, jobs_pb2.JobEvent], None]:
        """Called with each job event inside the transaction that writes it (the webhooks' outbox)."""
        return self.events.on_event

    @on_event.setter
    def on_event(self, hook: Callable[[sqlite3.Connection, str, jobs_pb2.JobEvent], None]) -> None:
        self.events.on_event = hook

    def close(self) -> None:
        """Close the database (shared with every other store on it)."""
        self.database.close()
