"""Placement: start queued jobs when the executor has room, and pass what the executor sees to the job lifecycle.

Which job runs next is decided here; whether it fits now, where it runs and
how its processes start is the executor's (:mod:`cantata.server.executors`);
what a placement or a worker's exit means for the job is the lifecycle's
(:mod:`cantata.server.jobs.lifecycle`). One background thread ticks every ``interval`` seconds: reap
exited workers, settle jobs whose workers are all gone, kill workers silent
past the heartbeat timeout (:mod:`cantata.server.workers.heartbeats`), then place
queued jobs, but only after something that can change a placement: a job
queued (submitted, resumed, requeued), a quota or tenant change (both
:meth:`Scheduler.wake` it at once), a worker exit, or a head that was not due
yet. Placement looks only at the queue's heads, the oldest queued job of each
tenant (:meth:`~cantata.server.store.Store.queue_head`), and whose turn it
is (:mod:`cantata.server.jobs.fairness`): the tenant with the fewest active jobs,
then the one that started a job least recently, so one with a thousand queued
jobs does not starve one with a single job, tenants take turns when slots are
scarce, and a quiet server's cost does not grow with its queue. A head that does not fit yet waits (with its reason recorded), and so
do the jobs behind it; one that cannot fit on the executor as it is (more GPUs
than the cluster has) is parked with its reason (:meth:`~cantata.server.store.Store.park`): the others pass it
in the index, and it is offered again when a recheck (one look per distinct reason, at the first tick after a
start and every ``UNFIT_RECHECK_S``) finds that reason changed. A job whose earlier workers are still stopping (a restart, a
resume, a deferred start) waits, and so do the jobs behind it.

While the audit log cannot be written (``audit_failure`` says why) a tick only
reaps exits: workers run on, and what their exits mean, the settling of their
jobs and new placements wait, so no job changes state unrecorded. A worker exit
or a settled job whose record failed mid-tick (the audit log, or a full data disk:
:class:`~cantata.server.database.DatabaseUnavailable`) is kept and handled again
at the next tick. Meanwhile a started job whose workers have all exited is shown
as not running (:meth:`~cantata.server.jobs.lifecycle.JobLifecycle.shown`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from cantata.proto.v1 import common_pb2 as pb
from cantata.security.audit import AuditLogUnavailable
from cantata.server.database import DatabaseUnavailable
from cantata.server.executors import Executor, NotPlaceable
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.store import ACTIVE, JobRecord, Store
from cantata.server.workers.heartbeats import Heartbeats

log = logging.getLogger(__name__)
UNFIT_RECHECK_S = 30.0  # how long a "never fits" verdict is trusted before its reason is checked again
PARK_BATCH = 256  # never-fitting jobs parked per transaction
UNTIL_AUDITABLE = "will start once the audit log can be written"  # why a job that could start waits


class Scheduler:
    def __init__(
        self,
        store: Store,
        launcher: Executor,
        lifecycle: JobLifecycle,
        heartbeats: Heartbeats,
        *,
        interval: float = 0.2,
        audit_failure: Callable[[], str | None] = lambda: None,
    ):
        self._store = store
        self._launcher = launcher
        self._lifecycle = lifecycle
        self._heartbeats = heartbeats
        self._interval = interval
        self._audit_failure = audit_failure
        self._exits: list = []  # reaped worker exits not yet handled
        self._unsettled: list[str] = []  # released jobs not yet settled
        self._cannot_write: str | None = None  # why the last tick could not record what it saw
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._place_due = True  # something changed that a placement depends on
        # Queued jobs the executor said it can never run are parked in the store (a pass then passes them in the
        # index, whatever their number); every UNFIT_RECHECK_S one of each reason is offered again, as a cluster can
        # grow; and at the first tick, as the verdicts may be an earlier server's, on a node since given more room.
        self._recheck_at = time.monotonic()
        self.on_placed: Callable[[JobRecord], None] = lambda job: None  # a job leaves the queue (its wait)
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def wake(self) -> None:
        """Place at once: a job was queued, or a quota or tenant changed. Thread-safe."""
        self._place_due = True
        self._woken.set()

    def _evaluation(self, job_id: str) -> dict[str, dict | None]:
        """What an admin planned for the job's workers, evaluation only: an attack, a fault (None: none)."""
        attack, fault = self._store.attack(job_id), self._store.fault(job_id)
        return {"attack": json.loads(attack) if attack else None, "fault": json.loads(fault) if fault else None}

    def start(self) -> None:
        """After a stop or a crash: re-adopt the workers of every started job, kill what no job owns; then tick.

        A started job whose workers were recorded keeps them: those still running are adopted (by
        pid and start time), those that exited meanwhile are reaped at the first tick and judged
        like any exit. Any other worker of this data directory (a restarting job's last ones, one
        started but never recorded) is killed; an active job with no recorded workers is queued again.
        """
        adopted: dict[str, int] = {}  # job id -> its workers still running
        # A queued job's recorded workers are a restarting job's last ones; the others hold none (read no more).
        for job in self._store.jobs(states=ACTIVE | {pb.QUEUED}, with_workers=True, limit=1_000_000):
            workers = self._store.workers(job.id)
            if job.state in ACTIVE and workers:
                alive = self._launcher.adopt(job, workers, **self._evaluation(job.id))
                if alive is not None:
                    adopted[job.id] = alive
                    continue
            for worker in workers:  # a restarting job's last workers (or ones their executor cannot adopt)
                self._launcher.kill_orphan(worker, job.id)
        for pid in self._launcher.kill_strays():
            log.warning("killed worker %d: no job records it", pid)
        self._lifecycle.server_restarted(adopted)
        self._launcher.scrub_all()
        self._thread.start()

    def shutdown(self, *, leave_jobs: bool) -> None:
        """Stop placing; then leave the running jobs to the next server, or stop them and requeue them."""
        self._stop.set()
        self._woken.set()
        self._thread.join()
        with self._lifecycle.lock:
            if leave_jobs:
                self._launcher.detach()
            else:
                self._launcher.stop_all()
                self._lifecycle.server_stopping()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._woken.wait(self._interval)
            self._woken.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:  # keep scheduling; the error is logged with its traceback
                log.exception("scheduler tick failed")

    def tick(self) -> None:
        with self._lifecycle.lock:
            self._exits.extend(self._launcher.poll())
            failure = self._audit_failure()
            if failure is None:
                try:
                    self._handle()
                except (AuditLogUnavailable, DatabaseUnavailable) as exc:  # what is left is handled at the next tick
                    failure = str(exc)
            self._note_cannot_write(failure)

    def _note_cannot_write(self, failure: str | None) -> None:
        """Show the started jobs whose workers all exited unrecorded as such; log when writing fails and recovers."""
        ended = {*self._unsettled, *self._launcher.finished_jobs()} if failure else set()
        self._lifecycle.ends_unrecorded(dict.fromkeys(ended, failure or ""))
        if failure != self._cannot_write:
            if failure:
                log.warning("job state changes wait: %s", failure)
            else:
                log.info("job state changes are recorded again")
            self._cannot_write = failure

    def _handle(self) -> None:
        """Judge the exits reaped so far, settle the jobs whose workers are all gone, kill the silent, place."""
        if self._exits:
            self._place_due = True  # a slot may be free
        while self._exits:
            exit_ = self._exits[0]
            self._lifecycle.worker_exited(exit_.job_id, exit_.worker, exit_.returncode, node_lost=exit_.node_lost)
            self._exits.pop(0)
        for job_id in self._launcher.finished_jobs():
            self._launcher.release(job_id)
            self._unsettled.append(job_id)
            self._place_due = True
        while self._unsettled:
            self._lifecycle.workers_exited(self._unsettled[0])
            self._unsettled.pop(0)
        self._kill_silent()
        if time.monotonic() >= self._recheck_at:  # the executor may have grown (a Ray cluster can)
            self._recheck_at = time.monotonic() + UNFIT_RECHECK_S
            self._recheck_parked()
        if self._place_due:
            self._place_due = False
            self._place()

    def _kill_silent(self) -> None:
        """Workers that sent nothing for longer than the heartbeat timeout are hung: the lifecycle kills them."""
        for job_id, worker, seconds in self._heartbeats.silent(self._launcher.live_workers()):
            self._lifecycle.worker_silent(job_id, worker, seconds)

    def _place(self) -> None:
        tried: set[str] = set()
        while not self._stop.is_set() and (job := self._store.queue_head()) is not None:
            if job.id in tried:  # its launch failed and it was queued again: once per pass
                self._place_due = True
                return
            tried.add(job.id)
            try:
                self._launcher.placement(job)
            except NotPlaceable as exc:
                if exc.never:  # the others pass it: parked, it is looked at again only when its reason is rechecked
                    self._park(job, exc)
                    continue
                self._store.set_waiting(job.id, str(exc))
                self._place_due = self._place_due or exc.retry  # else a worker's exit brings the next try
                return  # no overtaking by smaller jobs
            if not self._lifecycle.due(job):
                self._place_due = True  # nor while it waits to restart: try again next tick
                return
            if not self._lifecycle.placing(job):
                continue
            self.on_placed(job)
            try:
                pids = self._launcher.launch(self._store.job(job.id), **self._evaluation(job.id))
            except AuditLogUnavailable as exc:  # its keys were not released: nothing started
                self._lifecycle.placement_deferred(job, f"{exc}; {UNTIL_AUDITABLE}")
                self._place_due = True
                return
            except NotPlaceable as exc:  # the room placement saw was taken before the launch (a cluster's other users)
                self._lifecycle.placement_deferred(job, f"waiting: {exc}")
                self._place_due = True
                return
            except Exception as exc:
                log.exception("launch of %s failed", job.id)
                self._lifecycle.launch_failed(job, exc)
                continue
            try:
                self._lifecycle.placed(job, pids)
            except AuditLogUnavailable as exc:  # started but not recorded: stop it, and start it again later
                self._launcher.terminate(job.id)
                self._lifecycle.placement_deferred(job, f"{exc}; {UNTIL_AUDITABLE}")
                self._place_due = True
                return

    def _park(self, head: JobRecord, never: NotPlaceable) -> None:
        """Park ``head``, which can never run here, with the jobs queued right behind it in its tenant's queue that
        can never run either (up to ``PARK_BATCH``; a verdict depends on the job, not on its place): one
        transaction, and one look at the queue, for a run of them."""
        verdicts = [(head, str(never))]
        for job in self._store.queued_after(head, PARK_BATCH - 1):
            try:
                self._launcher.placement(job)
            except NotPlaceable as exc:
                if exc.never:
                    verdicts.append((job, str(exc)))
                    continue
            break  # it may run once it is the head: judged then
        self._store.park(verdicts)

    def _recheck_parked(self) -> None:
        """Ask the executor again about one parked job per reason; unpark the jobs of a reason that changed.

        A "never fits" verdict depends on the job's shape (its workers and what each needs), which its reason
        states: jobs parked for the same reason stand or fall together, so a recheck costs one look per reason.
        """
        for job, reason in self._store.parked_verdicts():
            try:
                self._launcher.placement(job)
            except NotPlaceable as exc:
                if exc.never and str(exc) == reason:
                    continue
            self._store.unpark(reason)  # wakes the scheduler: they are placed, or parked again, in turn
