"""Job lifecycle: place queued jobs on free worker slots and follow them to the end.

Placement (which job runs next, on how many slots) is decided here; starting
and signalling processes is the launcher's business. One background thread
ticks every ``interval`` seconds: reap exited workers, settle finished jobs,
then place queued ones.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from cantata.proto.v1 import common_pb2 as pb
from cantata.proto.v1 import jobs_pb2
from cantata.security.audit import Action
from cantata.server.datasource_store import DataSourceError
from cantata.server.jobspec import DECENTRALIZED, processes
from cantata.server.launcher import WorkerLauncher, kill_group, log_tail, process_alive
from cantata.server.store import ACTIVE, JobRecord, Store, WorkerRecord

log = logging.getLogger(__name__)


def quorum(spec: pb.JobSpec) -> int:
    """Worker processes a decentralized job needs alive: its ``min_workers`` worker groups (default a majority)."""
    return spec.min_workers * spec.ranks_per_worker


class Scheduler:
    def __init__(
        self,
        store: Store,
        launcher: WorkerLauncher,
        *,
        slots: int,
        grace: float,
        max_attempts: int,
        max_restarts: int,
        worker_secrets: Callable[[JobRecord], dict],
        record_certificate: Callable,
        audit: Callable[..., object],
        interval: float = 0.2,
    ):
        self._store = store
        self._launcher = launcher
        self._slots = slots
        self._grace = grace
        self._max_attempts = max_attempts
        self._max_restarts = max_restarts
        self._worker_secrets = worker_secrets
        self._record_certificate = record_certificate
        self._audit = audit
        self._interval = interval
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    # ---- lifecycle of the scheduler itself ----------------------------
    def start(self) -> None:
        self._recover()
        self._thread.start()

    def shutdown(self) -> None:
        """Stop placing, stop every running job, and requeue it to resume on restart."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._launcher.stop_all(self._grace)
            for job in self._store.jobs(states=ACTIVE):
                self._settle_interrupted(job, "server stopped")

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.tick()
            except Exception:  # keep scheduling; the error is logged with its traceback
                log.exception("scheduler tick failed")

    def tick(self) -> None:
        with self._lock:
            for exit_ in self._launcher.poll():
                self._store.set_gossip_address(exit_.job_id, exit_.worker, "")  # peers stop waiting for it
                if exit_.returncode != 0:
                    self._on_worker_failed(exit_.job_id, exit_.worker, exit_.returncode)
            for job_id in self._launcher.finished_jobs():
                self._launcher.release(job_id)
                self._settle(job_id)
            self._place()

    # ---- decisions ----------------------------------------------------
    def cancel(self, job_id: str, reason: str = "cancelled by tenant") -> None:
        with self._lock:
            job = self._store.job(job_id)
            if job.state == pb.QUEUED:
                self._store.transition(job_id, pb.CANCELLED, reason)
                self._audit_job(job, Action.JOB_CANCELLED, reason=reason)
            elif job.state in (pb.STARTING, pb.RUNNING):
                self._store.transition(job_id, pb.CANCELLING, reason)
                self._launcher.terminate(job_id, self._grace)
                if not self._launcher.is_running(job_id):  # workers not started yet, or gone
                    self._settle(job_id)

    def _place(self) -> None:
        free = self._slots - self._launcher.running_workers()
        for job in self._store.jobs(states=frozenset({pb.QUEUED})):
            if processes(job.spec) > free:
                break  # first come, first served: no overtaking by smaller jobs
            if job.attempts >= self._max_attempts:
                self._store.transition(job.id, pb.FAILED, f"gave up after {job.attempts} attempts")
                continue
            if not self._store.transition(job.id, pb.STARTING, "starting workers"):
                continue
            try:
                attack = self._store.attack(job.id)
                pids = self._launcher.launch(
                    self._store.job(job.id),
                    secrets=self._worker_secrets(job),
                    on_certificate=self._record_certificate,
                    attack=json.loads(attack) if attack else None,
                )
            except Exception as exc:
                log.exception("launch of %s failed", job.id)
                self._store.transition(job.id, pb.FAILED, f"could not start workers: {exc}")
                continue
            self._store.set_workers(job.id, pids)
            self._audit_job(job, Action.JOB_STARTED, workers=len(pids))
            free -= processes(job.spec)

    def _on_worker_failed(self, job_id: str, worker: int, code: int) -> None:
        job = self._store.job(job_id)
        if job.state not in (pb.STARTING, pb.RUNNING):
            return
        record = next(w for w in self._store.workers(job_id) if w.idx == worker)
        detail = record.failure or log_tail(self._launcher.log_path(job_id, worker)) or "no output"
        reason = f"worker {worker} exited with code {code}: {detail}"
        if job.spec.algorithm in DECENTRALIZED:
            reason = self._survive(job, record, reason)
            if not reason:
                return
        self._launcher.scrub(job_id)  # a failing job restarts no worker: its secrets go before it ends
        if self._store.transition(job_id, pb.FAILED, reason):
            self._audit_job(job, Action.JOB_FINISHED, state="FAILED", reason=reason)
        self._launcher.terminate(job_id, self._grace)

    def _survive(self, job: JobRecord, worker: WorkerRecord, reason: str) -> str:
        """A decentralized job outlives a dead worker: restart it, or go on while a quorum is alive.

        Returns "" if the job goes on, else why it fails. A restarted worker gets the job's
        secrets as they are now: if its data source was deleted, it is not restarted.
        """
        message = ""
        if worker.restarts < self._max_restarts:
            try:
                secrets = self._worker_secrets(job)
            except DataSourceError as exc:
                reason = f"{reason}; cannot restart it: {exc}"
            else:
                pid = self._launcher.relaunch(job, worker.idx, secrets=secrets, on_certificate=self._record_certificate)
                self._store.restart_worker(job.id, worker.idx, pid)
                message = f"{reason}; restarting it ({worker.restarts + 1}/{self._max_restarts})"
        if not message:
            alive = self._launcher.alive_workers(job.id)
            if alive < quorum(job.spec):
                return f"{reason}; fewer than min_workers={job.spec.min_workers} worker groups are left"
            message = f"{reason}; continuing with {alive} of {processes(job.spec)} worker processes"
        self._store.append_event(
            job.id,
            jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, worker=worker.idx, total_steps=job.spec.steps, message=message),
        )
        return ""

    def _settle(self, job_id: str) -> None:
        """All workers of the job are gone: decide how it ended."""
        job = self._store.job(job_id)
        if job.state == pb.CANCELLING:
            if self._store.transition(job_id, pb.CANCELLED, job.reason or "cancelled"):
                self._audit_job(job, Action.JOB_CANCELLED, reason=job.reason)
        elif job.state in (pb.STARTING, pb.RUNNING):
            workers = self._store.workers(job_id)
            needed = quorum(job.spec) if job.spec.algorithm in DECENTRALIZED else len(workers)
            if workers and sum(w.finished for w in workers) >= needed:
                state, reason = pb.SUCCEEDED, ""
            else:
                state, reason = pb.FAILED, "workers exited without finishing"
            if self._store.transition(job_id, state, reason):
                self._audit_job(job, Action.JOB_FINISHED, state=pb.JobState.Name(state), reason=reason)

    def _settle_interrupted(self, job: JobRecord, why: str) -> None:
        if job.state == pb.CANCELLING:
            self._store.transition(job.id, pb.CANCELLED, job.reason or "cancelled")
        elif job.attempts >= self._max_attempts:
            self._store.transition(job.id, pb.FAILED, f"{why}; gave up after {job.attempts} attempts")
        else:
            self._store.transition(job.id, pb.QUEUED, f"{why}; will resume from the last checkpoint")

    def _recover(self) -> None:
        """After a crash: kill orphaned workers, requeue or end every active job, scrub every workspace."""
        for job in self._store.jobs(states=ACTIVE):
            for worker in self._store.workers(job.id):
                if process_alive(worker.pid, job.id):
                    kill_group(worker.pid, 9)
            self._settle_interrupted(job, "server restarted")
        self._launcher.scrub_all()

    def _audit_job(self, job: JobRecord, action: str, **details) -> None:
        self._audit("server", action, resource=job.id, tenant=job.tenant, details=details)
