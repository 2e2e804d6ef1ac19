"""Deleting an ended job for good: its checkpoints, its workspace (worker logs) and its records, audited.

A tenant deletes its own job (``cantata jobs delete``); the
:class:`RetentionSweeper` deletes ended jobs older than their tenant's
retention. Checkpoint objects lie in a blob store no transaction covers, so a
deletion starts only while the audit log can record it; the objects go
first (a retry after a failure deletes what is left), then the
``job_deleted`` record and the store rows in one transaction: the job
exists until its deletion is on the record.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from cantata.security.audit import Action
from cantata.security.sealed_checkpoint import delete_job_checkpoints
from cantata.server.network.ports import AuditSink
from cantata.server.periodic import PeriodicTask
from cantata.server.store import Conflict, JobRecord, NotEnded, Store
from cantata.storage import open_store

log = logging.getLogger(__name__)
RETENTION_ACTOR = "cantata:retention"


class JobDeletion:
    def __init__(
        self,
        store: Store,
        audit: AuditSink,
        workspace: Callable[[str], Path],
        is_running: Callable[[str], bool] = lambda job_id: False,
    ):
        """``workspace(job_id)`` is the job's folder of logs; ``is_running(job_id)`` whether processes of it remain."""
        self._store = store
        self._audit = audit
        self._workspace = workspace
        self._is_running = is_running

    def delete(self, job: JobRecord, *, actor: str, peer: str = "", reason: str) -> int:
        """Delete ``job`` (which must have ended, its workers gone); returns the checkpoint objects removed."""
        self._audit.require_writable()
        if not job.terminal:
            raise NotEnded(job)
        if self._is_running(job.id):
            raise Conflict(f"job {job.id!r} has ended but its workers are still stopping; delete it in a moment")
        objects = delete_job_checkpoints(open_store(job.spec.checkpoint_store), tenant=job.tenant, job_id=job.id)

        def record(ended: JobRecord) -> None:
            self._audit.append(
                actor,
                Action.JOB_DELETED,
                resource=ended.id,
                tenant=ended.tenant,
                details={"reason": reason, "name": ended.spec.name, "checkpoint_objects": objects},
                peer=peer,
            )

        self._store.jobs.delete(job.id, before=record)
        shutil.rmtree(self._workspace(job.id), ignore_errors=True)
        return objects


class RetentionSweeper(PeriodicTask):
    """Every ``interval`` seconds, deletes the ended jobs older than their tenant's retention (``sweep``)."""

    def __init__(self, store: Store, deletion: JobDeletion, *, interval: float):
        super().__init__("retention", interval, at_start=False)
        self._store = store
        self._deletion = deletion

    def tick(self) -> list[str]:
        return self.sweep()

    def sweep(self, now: dt.datetime | None = None) -> list[str]:
        """Delete every job past its retention at ``now`` (default: the current time); returns their ids."""
        deleted = []
        for job in self._store.jobs.expired(now or dt.datetime.now(dt.UTC)):
            try:
                self._deletion.delete(job, actor=RETENTION_ACTOR, reason="retention")
            except Exception:  # one job's store being down delays only that job; the next sweep retries it
                log.exception("retention could not delete %s", job.id)
                continue
            deleted.append(job.id)
        if deleted:
            log.info("retention deleted %d ended job(s): %s", len(deleted), ", ".join(deleted))
        return deleted
