"""A job's lifecycle: every transition of its state, and what each event of its workers means.

``QUEUED → STARTING → RUNNING → SUCCEEDED | FAILED | CANCELLED``, with
``CANCELLING`` between a cancel and its end. Terminal states are final, except
that a tenant may resume a FAILED or CANCELLED job (:meth:`~JobLifecycle.resume_requested`).

- Placement: the scheduler picks a queued job that is :meth:`~JobLifecycle.due`;
  :meth:`JobLifecycle.placing` starts an attempt, then the scheduler reports
  :meth:`~JobLifecycle.placed` or :meth:`~JobLifecycle.launch_failed`.
- Worker reports (the worker service): worker 0 started → RUNNING; each
  finished or failed worker is marked, for its exit to be judged.
- Worker exits (the scheduler, from the launcher): a worker that exits with an
  error is a failure. An all-reduce or single job restarts its worker group
  (:meth:`~JobLifecycle.restart`) from its latest checkpoint (back to QUEUED, placed again
  after a backoff) until it has had more than its budget of failures
  (:mod:`cantata.server.jobs.restarts`), then fails (a worker lost with its node, on
  a cluster, restarts the group without counting against that budget: the
  job did not fail, the machine did); a decentralized job restarts
  the dead worker alone, or goes on while a quorum of worker groups lives.
  A worker that reports a permanent failure (bad data or settings, or, in a
  decentralized job, a final average that failed or reached fewer than
  ``min_workers``) fails the job at once, unless its peers had quarantined
  it: then it is left out, as it was of their consensus.
  Once all of a job's workers exited, it is settled: SUCCEEDED if enough of
  them finished, else FAILED; CANCELLED if it was being cancelled.
- Cancellation (a tenant's request, or its suspension): a queued job ends at
  once; a started one is CANCELLING until its workers exited.
- Resumption (a tenant's request): a FAILED or CANCELLED job is QUEUED again
  under its id, to resume from its last checkpoint; the one way out of a
  terminal state.
- Hung workers (the scheduler, from the heartbeats): a worker silent past the
  heartbeat timeout is killed, and its exit is judged like any other.
- The server: a restarted server re-adopts the workers of every started job
  (:meth:`~JobLifecycle.server_restarted`), which goes on as if nothing
  happened: same attempt, no failure. A server stopped with ``on_stop:
  requeue`` stops the workers, and every active job goes back to QUEUED, to
  resume from its last checkpoint, as does an active job whose workers were
  never recorded; that is no failure either (``attempts`` counts starts, for
  information only).

Each event method writes the store transition together with its audit record,
in one store transaction committed only once the record is durable: a
transition the audit log cannot record does not happen (the caller sees
:class:`~cantata.security.audit.AuditLogUnavailable` and the scheduler
retries it once the log can be written again); likewise while the database
cannot be written (a full data disk: :class:`~cantata.server.database.DatabaseUnavailable`).
Every terminal state has exactly one ``job_finished`` or ``job_cancelled`` record.
Until then, a started job whose workers have all exited is not shown as
started (:meth:`~JobLifecycle.shown`): it shows QUEUED, with why its end waits.
Processes are the launcher's business, reached through :class:`WorkerProcesses`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping

from cantata.proto.v1 import common_pb2 as pb
from cantata.proto.v1 import jobs_pb2
from cantata.security.audit import Action
from cantata.server.datasource_store import DataSourceError
from cantata.server.jobs.groups import decentralized, processes, quorum
from cantata.server.jobs.jobspec import resumed_spec
from cantata.server.jobs.restarts import RestartPolicy
from cantata.server.network.ports import AuditSink, WorkerProcesses
from cantata.server.store import ACTIVE, JobRecord, Store, WorkerRecord

STARTED = (pb.STARTING, pb.RUNNING)


class JobLifecycle:
    """Moves jobs through their states as events arrive; one lock orders the events that act on processes.

    The scheduler holds :attr:`lock` while it places a job, so that a cancel cannot come between
    the start of an attempt and the launch of its workers.
    """

    def __init__(
        self,
        store: Store,
        audit: AuditSink,
        workers: WorkerProcesses,
        *,
        restarts: RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._store = store
        self._audit = audit
        self._workers = workers
        self._restarts = restarts
        self._clock = clock
        self._not_before: dict[str, float] = {}  # job id -> when a restarting job may be placed again
        self._permanent: dict[str, set[int]] = {}  # job id -> its workers that reported a permanent failure
        self._relaunched: dict[tuple[str, int], tuple[int, str]] = {}  # relaunched, pid and event not recorded yet
        self._unrecorded_ends: Mapping[str, str] = {}  # started job -> why the exit of all its workers is not recorded
        self._shown_changed: list[Callable[[], None]] = []
        self.lock = threading.RLock()

    # ---- what is shown ------------------------------------------------------
    def ends_unrecorded(self, why: Mapping[str, str]) -> None:
        """The started jobs whose workers have all exited while their end cannot be recorded (job id -> why not)."""
        if why == self._unrecorded_ends:
            return
        self._unrecorded_ends = why
        for hook in self._shown_changed:
            hook()

    def on_shown_change(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` whenever :meth:`shown` may show a job otherwise than before (a cache of it is stale)."""
        self._shown_changed.append(hook)

    def shown(self, job: JobRecord) -> JobRecord:
        """``job`` as tenants see it: a started job whose workers all exited unrecorded is QUEUED, saying why."""
        why = self._unrecorded_ends.get(job.id)
        if why is None or job.state not in STARTED:
            return job
        reason = f"its workers exited; what that means for the job is recorded once the server can write: {why}"
        return dataclasses.replace(job, state=pb.QUEUED, reason=reason)

    # ---- placement ------------------------------------------------------
    def due(self, job: JobRecord) -> bool:
        """Whether a queued job may be placed now: no worker of its last attempt is left, and its backoff is over."""
        return not self._workers.is_running(job.id) and self._clock() >= self._not_before.get(job.id, 0.0)

    def placing(self, job: JobRecord) -> bool:
        """Start an attempt of a queued job (STARTING); False if it is not to be launched (it moved on)."""
        self._not_before.pop(job.id, None)
        self._permanent.pop(job.id, None)
        return self._store.transition(job.id, pb.STARTING, "starting workers")

    def placed(self, job: JobRecord, pids: dict[int, int]) -> None:
        """The job's workers were started with these pids (process index -> pid)."""
        started = {i: self._workers.started_at(job.id, i) for i in pids}
        with self._store.database.transaction():
            self._store.set_workers(job.id, pids, started)
            self._audit_job(job, Action.JOB_STARTED, workers=len(pids))

    def placement_deferred(self, job: JobRecord, why: str) -> None:
        """The start could not go on (the audit log could not record it, or the executor's resources were
        taken meanwhile); its workers, if any, are stopped: queue the job again, saying ``why``."""
        self._store.transition(job.id, pb.QUEUED, why)

    def launch_failed(self, job: JobRecord, error: Exception) -> None:
        reason = f"could not start workers: {error}"
        with self._store.database.transaction():
            if self._store.transition(job.id, pb.FAILED, reason):
                self._audit_job(job, Action.JOB_FINISHED, state="FAILED", reason=reason)

    # ---- what workers report ----------------------------------------------
    def worker_started(self, job: JobRecord, worker: int) -> None:
        if job.state == pb.STARTING and worker == 0:
            self._store.transition(job.id, pb.RUNNING, "workers running")

    def worker_finished(self, job: JobRecord, worker: int, final_val_loss: float) -> None:
        self._store.mark_worker(job.id, worker, finished=True)
        if worker == 0:
            self._store.record_progress(job.id, step=job.spec.steps, val_loss=final_val_loss)

    def worker_failed(self, job: JobRecord, worker: int, reason: str, *, permanent: bool = False) -> None:
        """The worker says why it fails; the reason is given when its exit is judged.

        A ``permanent`` failure (the job's data or settings are at fault, or a decentralized worker's
        final average failed) ends the job without a restart: it would fail the same way. In a
        decentralized job only the worker's own permanent failure counts, and one of a worker its peers
        quarantined does not end the job: that worker is left out, as it was of their consensus.
        """
        self._store.mark_worker(job.id, worker, failure=reason)
        if permanent:
            self._permanent.setdefault(job.id, set()).add(worker)

    # ---- what the launcher sees -------------------------------------------
    def worker_exited(self, job_id: str, worker: int, returncode: int, *, node_lost: bool = False) -> None:
        """Worker ``worker`` exited with ``returncode``; ``node_lost``: its node was lost with it (the executor saw)."""
        with self.lock:
            self._store.set_gossip_address(job_id, worker, "")  # peers stop waiting for it
            if returncode != 0:
                self._worker_died(job_id, worker, returncode, node_lost=node_lost)

    def workers_exited(self, job_id: str) -> None:
        """All workers of the job are gone: decide how it ended."""
        with self.lock:
            job = self._store.job(job_id)
            if job.state == pb.CANCELLING:
                with self._store.database.transaction():
                    if self._store.transition(job_id, pb.CANCELLED, job.reason or "cancelled"):
                        self._audit_job(job, Action.JOB_CANCELLED, reason=job.reason)
            elif job.state in STARTED:
                workers = self._store.workers(job_id)
                needed = quorum(job.spec) if decentralized(job.spec) else len(workers)
                if workers and sum(w.finished for w in workers) >= needed:
                    state, reason = pb.SUCCEEDED, ""
                else:  # with what those that said why failed of (a quarantined worker's lost final average)
                    said = [f"worker {w.idx}: {w.failure}" for w in workers if not w.finished and w.failure]
                    state, reason = pb.FAILED, "; ".join(["workers exited without finishing", *said])
                with self._store.database.transaction():
                    if self._store.transition(job_id, state, reason):
                        self._audit_job(job, Action.JOB_FINISHED, state=pb.JobState.Name(state), reason=reason)

    def _worker_died(self, job_id: str, worker: int, code: int, *, node_lost: bool = False) -> None:
        job = self._store.job(job_id)
        if job.state not in STARTED:
            return
        record = next(w for w in self._store.workers(job_id) if w.idx == worker)
        detail = record.failure or self._workers.log_tail(job_id, worker) or "no output"
        reason = f"worker {worker} exited with code {code}: {detail}"
        if job_id in self._permanent and not decentralized(job.spec):
            self._fail(job, f"{reason}; not restarted: the error is permanent")
            return
        if not decentralized(job.spec):
            if node_lost:
                self.restart(job_id, f"worker {worker} was lost with its node", worker=worker, counted=False)
            else:
                self.restart(job_id, reason, worker=worker)
            return
        if worker in self._permanent.get(job_id, ()):
            if not self._quarantined(job, worker):
                self._fail(job, f"{reason}; not restarted: the error is permanent")
                return
            message = f"{reason}; not restarted: its peers quarantined it, and their consensus is the job's"
            self._store.append_event(  # the job ends as the others' consensus does (workers_exited)
                job.id,
                jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, worker=worker, total_steps=job.spec.steps, message=message),
            )
            return
        reason = self._survive(job, record, reason)
        if reason:
            self._fail(job, reason)

    def restart(self, job_id: str, reason: str, *, worker: int = 0, counted: bool = True) -> bool:
        """One failure of a started job (``reason`` says what failed): restart its worker group, or fail it.

        Within its budget the job goes back to QUEUED, its workers are stopped, and the scheduler starts
        them again from the latest checkpoint once they are all gone and the backoff has passed; an event
        and a ``job_restarted`` record say so. Past its budget the job fails. Returns whether it restarts.
        A worker that died, or one that stopped responding (the heartbeat), both come here. Not ``counted``
        (a worker lost with its node): the job restarts whatever its budget, and its failures stay as they are.
        """
        with self.lock:
            job = self._store.job(job_id)
            if job.state not in STARTED:
                return False
            budget = self._restarts.budget(job.spec)
            with self._store.database.transaction():
                failures = self._store.count_failure(job_id) if counted else min(job.failures, budget)
                if failures <= budget:
                    step = self._store.latest_checkpoint_step(job_id)
                    self._audit_job(
                        job, Action.JOB_RESTARTED, failures=failures, max_failures=budget, from_step=step, reason=reason
                    )
                    counts = f"attempt {failures}/{budget}" if counted else f"not counted: {failures}/{budget} failures"
                    message = f"{reason}; restarting the job from step {step} ({counts})"
                    event = jobs_pb2.JobEvent(
                        kind=jobs_pb2.MESSAGE, worker=worker, step=step, total_steps=job.spec.steps, message=message
                    )
                    self._store.append_event(job_id, event)
                    after = f"failure {failures}/{budget}" if counted else "its node was lost"
                    self._store.transition(job_id, pb.QUEUED, f"restarting from step {step} after {after}")
            if failures > budget:
                plural = "" if failures == 1 else "s"
                self._fail(job, f"{reason}; gave up after {failures} failure{plural} (max_failures={budget})")
                return False
            self._not_before[job_id] = self._clock() + self._restarts.delay(failures)
            self._workers.terminate(job_id)
            return True

    def _fail(self, job: JobRecord, reason: str) -> None:
        self._workers.scrub(job.id)  # a failing job restarts no worker: its secrets go before it ends
        with self._store.database.transaction():
            if self._store.transition(job.id, pb.FAILED, reason):
                self._audit_job(job, Action.JOB_FINISHED, state="FAILED", reason=reason)
        self._workers.terminate(job.id)

    def _quarantined(self, job: JobRecord, worker: int) -> bool:
        """Whether a peer reported quarantining ``worker``'s group (its anomaly reports name the group's process)."""
        size = job.spec.ranks_per_worker
        return any(a.quarantined and a.peer // size == worker // size for a in self._store.anomalies(job.id))

    def _survive(self, job: JobRecord, worker: WorkerRecord, reason: str) -> str:
        """A decentralized job outlives a dead worker: restart it, or go on while a quorum is alive.

        Returns "" if the job goes on, else why it fails. A restarted worker gets the job's
        secrets as they are now: if its data source was deleted, it is not restarted.
        """
        message, budget, key = "", self._restarts.budget(job.spec), (job.id, worker.idx)
        if key not in self._relaunched and worker.restarts < budget:
            self._store.restart_worker(job.id, worker.idx)  # first: if this write fails, nothing was relaunched
            try:
                pid = self._workers.relaunch(job, worker.idx)
            except DataSourceError as exc:
                reason = f"{reason}; cannot restart it: {exc}"
            else:
                self._relaunched[key] = (pid, f"{reason}; restarting it ({worker.restarts + 1}/{budget})")
        if key in self._relaunched:  # relaunched now, or by an earlier try of this exit whose later writes failed
            pid, message = self._relaunched[key]
            with self._store.database.transaction():
                self._store.worker_relaunched(job.id, worker.idx, pid, self._workers.started_at(job.id, worker.idx))
                self._append_message(job, worker.idx, message)
            del self._relaunched[key]
            return ""
        if not message:
            alive = self._workers.alive_workers(job.id)
            if alive < quorum(job.spec):
                return f"{reason}; fewer than min_workers={job.spec.min_workers} worker groups are left"
            message = f"{reason}; continuing with {alive} of {processes(job.spec)} worker processes"
        self._append_message(job, worker.idx, message)
        return ""

    def _append_message(self, job: JobRecord, worker: int, message: str) -> None:
        self._store.append_event(
            job.id, jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, worker=worker, total_steps=job.spec.steps, message=message)
        )

    # ---- cancellation -----------------------------------------------------
    def cancel_requested(self, job: JobRecord, *, actor: str, peer: str) -> None:
        """The job's tenant asked to cancel it (audited as asked, whatever the job's state then)."""
        if job.terminal:
            return
        self._audit.append(actor, Action.JOB_CANCEL_REQUESTED, resource=job.id, tenant=job.tenant, peer=peer)
        self._cancel(job.id, "cancelled by tenant")

    def cancel_for_tenant(self, job_id: str, reason: str) -> None:
        """The server cancels a job on its tenant's behalf (a sweep's pruned trial), saying ``reason``."""
        self._cancel(job_id, reason)

    def tenant_suspended(self, tenant: str) -> None:
        """Cancel every job of a tenant that was just suspended."""
        for job in self._store.jobs(tenant=tenant):
            if not job.terminal:
                self._cancel(job.id, "tenant suspended")

    def _cancel(self, job_id: str, reason: str) -> None:
        with self.lock:
            job = self._store.job(job_id)
            if job.state == pb.QUEUED:
                with self._store.database.transaction():
                    self._store.transition(job_id, pb.CANCELLED, reason)
                    self._audit_job(job, Action.JOB_CANCELLED, reason=reason)
            elif job.state in STARTED:
                self._store.transition(job_id, pb.CANCELLING, reason)
                self._workers.terminate(job_id)
                if not self._workers.is_running(job_id):  # workers not started yet, or gone
                    self.workers_exited(job_id)

    # ---- resumption ---------------------------------------------------------
    def resume_requested(self, job: JobRecord, *, actor: str, peer: str, changes: dict[str, int] | None = None) -> None:
        """The job's tenant asked to resume a FAILED or CANCELLED job: QUEUED again under its id.

        Its workers resume from its latest checkpoint, as after a requeue. ``changes``
        (workers, mesh sizes, steps) move a mesh job to another mesh or train it
        further, a SUCCEEDED one too when they add steps; they are checked as at
        submit (:func:`~cantata.server.jobs.jobspec.resumed_spec`). Refused (and not
        audited) for any other state, or over the tenant's quotas; audited, with
        the changes, before it happens.
        """
        wanted = {field: value for field, value in (changes or {}).items() if value}

        def audit(current: JobRecord) -> None:
            state = pb.JobState.Name(current.state)
            self._audit.append(
                actor,
                Action.JOB_RESUMED,
                resource=job.id,
                tenant=job.tenant,
                peer=peer,
                details={"from": state, **{field: str(value) for field, value in wanted.items()}},
            )

        with self.lock:
            self._store.resume_job(
                job.id,
                self._store.tenant(job.tenant),
                "resumed by tenant" + "".join(f", {field} {value}" for field, value in wanted.items()),
                before=audit,
                spec=(lambda spec: resumed_spec(spec, wanted)) if wanted else None,
            )

    # ---- hung workers ---------------------------------------------------------
    def worker_silent(self, job_id: str, worker: int, seconds: float) -> None:
        """A worker sent no report for ``seconds`` (past the heartbeat timeout): kill it as hung, unless it finished.

        Its exit then takes the path of any dead worker (:meth:`worker_exited`).
        """
        with self.lock:
            job = self._store.job(job_id)
            if job.state not in STARTED:
                return  # ending already: the launcher's grace period kills what is left
            if any(w.idx == worker and w.finished for w in self._store.workers(job_id)):
                return  # it finished and is exiting, which may take a while on a busy node: not hung
            message = f"worker {worker} sent no heartbeat for {seconds:.1f} s; killed"
            self._store.append_event(
                job_id,
                jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, worker=worker, total_steps=job.spec.steps, message=message),
            )
            self._workers.kill(job_id, worker)

    # ---- the server ---------------------------------------------------------
    def server_stopping(self) -> None:
        """The server stopped every worker: requeue each active job to resume on restart."""
        with self.lock:
            for job in self._store.jobs(states=ACTIVE):
                self._interrupted(job, "server stopped")

    def server_restarted(self, adopted: dict[str, int]) -> None:
        """The server starts, having re-adopted the workers of the ``adopted`` jobs (job id -> how many still run):
        they go on (a cancelling one is stopped again); every other active job, whose workers were never
        recorded, is requeued or ended.
        """
        with self.lock:
            for job in self._store.jobs(states=ACTIVE):
                if job.id not in adopted:
                    self._interrupted(job, "server restarted")
                    continue
                alive = adopted[job.id]
                self._store.append_event(
                    job.id,
                    jobs_pb2.JobEvent(
                        kind=jobs_pb2.MESSAGE,
                        total_steps=job.spec.steps,
                        message=f"server restarted; re-adopted {alive} running worker process"
                        + ("" if alive == 1 else "es"),
                    ),
                )
                if job.state == pb.CANCELLING:
                    self._workers.terminate(job.id)

    def _interrupted(self, job: JobRecord, why: str) -> None:
        """The server went away under a job: no failure of the job, which resumes (or ends, if cancelling)."""
        if job.state == pb.CANCELLING:
            reason = job.reason or "cancelled"
            with self._store.database.transaction():
                if self._store.transition(job.id, pb.CANCELLED, reason):
                    self._audit_job(job, Action.JOB_CANCELLED, reason=reason)
        else:
            self._store.transition(job.id, pb.QUEUED, f"{why}; will resume from the last checkpoint")

    def _audit_job(self, job: JobRecord, action: str, **details: object) -> None:
        self._audit.append("server", action, resource=job.id, tenant=job.tenant, details=details)
