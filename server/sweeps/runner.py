"""The sweep runner: one thread that moves every active sweep on, a pass every ``interval`` seconds.

A pass over a running sweep, with Optuna's study of it:

- each RUNNING trial gets its job if it has none yet (submitted with the request id ``<sweep>-t<number>``, so
  a retry after a crash finds the job a first attempt made), then the validation losses its job reported since
  the last pass, one by one, each followed by the pruner's verdict: a pruned trial's job is cancelled with the
  reason "pruned", then the trial is told PRUNED; a trial whose job ended is told COMPLETE (with the job's final
  validation loss), PRUNED (a job cancelled as pruned: a crash came between the two) or FAIL;
- then new trials are asked for while fewer than ``concurrency`` run and fewer than ``trials`` were asked for;
- a pruned or failed trial's job takes its slot until it has stopped;
- a sweep with all its trials asked for and no job of them running ends: SUCCEEDED if a trial completed, else FAILED.

A cancelled sweep's (or a suspended tenant's) running trials have their jobs cancelled and are told FAIL. Optuna's storage is durable
on each call, and every step above can be repeated after a crash without changing its outcome: a restarted
server goes on where the last one stopped, no trial lost or run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from cantata.proto.v1 import common_pb2, sweeps_pb2
from cantata.security.audit import Action
from cantata.server.datasource_store import DataSourceNotFound
from cantata.server.jobs.jobspec import InvalidField
from cantata.server.network.ports import AuditSink
from cantata.server.periodic import PeriodicTask
from cantata.server.store import JobRecord, NotFound, QuotaExceeded, RequestIdReused, Store
from cantata.server.store.metrics import MetricsStore
from cantata.server.sweeps import space
from cantata.server.sweeps.store import SweepRecord, SweepStore

PRUNED_REASON = "pruned"
JOB_ATTR = "job_id"  # the trial's job, a user attribute of the Optuna trial
REASON_ATTR = "reason"  # why a trial failed or was pruned

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

# A trial's job could not be submitted for what it asks: the trial fails, the sweep goes on.
TRIAL_REFUSALS = (InvalidField, DataSourceNotFound, RequestIdReused)
SubmitTrial = Callable[[str, str, common_pb2.JobSpec], JobRecord]  # (tenant, request id, spec) -> the job


def optuna_storage(path: Path) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the SQLite file ``path``, readable by the owner only."""
    path.touch(mode=0o600, exist_ok=True)
    return optuna.storages.RDBStorage(f"sqlite:///{path}")


def trial_request_id(sweep_id: str, number: int) -> str:
    return f"{sweep_id}-t{number}"


class SweepRunner(PeriodicTask):
    def __init__(
        self,
        sweeps: SweepStore,
        jobs: Store,
        metrics: MetricsStore,
        storage: optuna.storages.BaseStorage,
        *,
        submit: SubmitTrial,
        cancel: Callable[[str, str], None],
        audit: AuditSink,
        interval: float = 0.25,
    ):
        super().__init__("sweeps", interval, at_start=True)
        self._sweeps = sweeps
        self._jobs = jobs
        self._metrics = metrics
        self.storage = storage
        self._submit = submit
        self._cancel = cancel  # (job id, reason)
        self._audit = audit
        self._studies: dict[str, optuna.Study] = {}
        self._ended: set[str] = set()  # jobs of pruned or failed trials seen ended

    def tick(self) -> None:
        for sweep in self._sweeps.active():
            try:
                self._advance(sweep)
            except Exception:  # one sweep's fault (a store outage) does not hold the others up
                log.exception("sweep %s: the pass failed; tried again in the next", sweep.id)

    def study(self, sweep: SweepRecord) -> optuna.Study:
        """The sweep's study, with its sampler and pruner (created by the first pass over it)."""
        study = self._studies.get(sweep.id)
        if study is None:
            study = optuna.create_study(
                storage=self.storage,
                study_name=sweep.id,
                direction="minimize",
                sampler=space.sampler(sweep.spec),
                pruner=space.pruner(sweep.spec),
                load_if_exists=True,
            )
            self._studies[sweep.id] = study
        return study

    def _advance(self, sweep: SweepRecord) -> None:
        study = self.study(sweep)
        status = self._jobs.tenant_status(sweep.tenant)
        if not sweep.terminal and status != "APPROVED":  # suspended: its jobs were cancelled, no new one starts
            reason = f"tenant {str(status).lower()}"
            self._sweeps.end(
                sweep.id,
                sweeps_pb2.SWEEP_CANCELLED,
                reason,
                before=lambda: self._audit.append(
                    "server",
                    Action.SWEEP_FINISHED,
                    resource=sweep.id,
                    tenant=sweep.tenant,
                    details={"state": "SWEEP_CANCELLED", "reason": reason},
                ),
            )
            sweep = self._sweeps.sweep(sweep.id)
        if sweep.terminal:  # cancelled: stop what runs, then nothing is left to do
            for trial in _running(study):
                self._abandon(study, trial, "sweep cancelled")
            self._sweeps.settle(sweep.id)
            self._studies.pop(sweep.id, None)
            return
        waiting = ""
        for trial in _running(study):
            waiting = self._follow(sweep, study, trial) or waiting
        busy, asked = self._busy(study), len(study.get_trials(deepcopy=False))
        while not waiting and busy < sweep.spec.concurrency and asked < sweep.spec.trials:
            waiting = self._start(sweep, study.ask(space.distributions(sweep.spec)))
            busy, asked = self._busy(study), asked + 1
        self._sweeps.set_reason(sweep.id, waiting)
        if asked >= sweep.spec.trials and busy == 0:
            self._finish(sweep, study.get_trials(deepcopy=False))

    def _busy(self, study: optuna.Study) -> int:
        """The trials whose jobs take a slot: running ones, and pruned or failed ones whose jobs still stop."""
        busy = 0
        for t in study.get_trials(deepcopy=False):
            job_id = t.user_attrs.get(JOB_ATTR)
            if t.state == TrialState.RUNNING:
                busy += 1
            elif t.state != TrialState.COMPLETE and job_id is not None and job_id not in self._ended:
                try:
                    ended = self._jobs.job(job_id).terminal
                except NotFound:
                    ended = True
                if ended:
                    self._ended.add(job_id)
                busy += not ended
        return busy

    # ---- one trial --------------------------------------------------------
    def _start(self, sweep: SweepRecord, trial: optuna.Trial) -> str:
        """Submit the trial's job (once: see the module); "" or, if the tenant's quota holds it back, why."""
        spec = space.trial_job(sweep.id, sweep.spec, trial.number, trial.params)
        try:
            job = self._submit(sweep.tenant, trial_request_id(sweep.id, trial.number), spec)
        except QuotaExceeded as exc:
            return f"trial {trial.number} waits for the tenant's quota: {exc}"
        except TRIAL_REFUSALS as exc:
            trial.set_user_attr(REASON_ATTR, f"its job was refused: {exc}")
            trial.study.tell(trial.number, state=TrialState.FAIL)
            return ""
        self._audit.append(
            "server",
            Action.SWEEP_TRIAL_STARTED,
            resource=sweep.id,
            tenant=sweep.tenant,
            details={
                "trial": trial.number,
                "job": job.id,
                "params": {k: space.shown(v) for k, v in trial.params.items()},
            },
        )
        trial.set_user_attr(JOB_ATTR, job.id)
        return ""

    def _follow(self, sweep: SweepRecord, study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> str:
        """Report the trial's new validation losses to the pruner, and settle it if its job ended; "" or why
        the trial still waits for its job."""
        trial = optuna.Trial(study, frozen._trial_id)
        job_id = frozen.user_attrs.get(JOB_ATTR)
        if job_id is None:
            return self._start(sweep, trial)
        try:
            job = self._jobs.job(job_id)
        except NotFound:  # deleted by its tenant meanwhile
            self._fail(trial, "its job was deleted")
            return ""
        last = frozen.last_step if frozen.last_step is not None else -1
        for point in self._metrics.rows(job_id, ["val_loss"]):
            if point.worker != 0 or point.peer is not None or point.step <= last or not math.isfinite(point.value):
                continue
            trial.report(point.value, point.step)
            last = point.step
            if not job.terminal and trial.should_prune():
                self._prune(sweep, trial, job, point.step, point.value)
                return ""
        if not job.terminal:
            return ""
        if job.state == common_pb2.SUCCEEDED and math.isfinite(job.val_loss):
            study.tell(trial.number, job.val_loss)
        elif job.state == common_pb2.CANCELLED and job.reason == PRUNED_REASON:
            study.tell(trial.number, state=TrialState.PRUNED)
        else:
            self._fail(trial, f"its job ended {common_pb2.JobState.Name(job.state)}: {job.reason}")
        return ""

    def _prune(self, sweep: SweepRecord, trial: optuna.Trial, job: JobRecord, step: int, value: float) -> None:
        """Cancel the job first, then tell Optuna: a crash between the two leaves a job cancelled as pruned."""
        self._audit.append(
            "server",
            Action.SWEEP_TRIAL_PRUNED,
            resource=sweep.id,
            tenant=sweep.tenant,
            details={"trial": trial.number, "job": job.id, "step": step, "val_loss": value},
        )
        self._cancel(job.id, PRUNED_REASON)
        trial.set_user_attr(REASON_ATTR, f"pruned at step {step} (validation loss {value:.4g})")
        trial.study.tell(trial.number, state=TrialState.PRUNED)

    def _abandon(self, study: optuna.Study, frozen: optuna.trial.FrozenTrial, reason: str) -> None:
        job_id = frozen.user_attrs.get(JOB_ATTR)
        if job_id is not None:
            with contextlib.suppress(NotFound):
                if not self._jobs.job(job_id).terminal:
                    self._cancel(job_id, reason)
        self._fail(optuna.Trial(study, frozen._trial_id), reason)

    @staticmethod
    def _fail(trial: optuna.Trial, reason: str) -> None:
        trial.set_user_attr(REASON_ATTR, reason)
        trial.study.tell(trial.number, state=TrialState.FAIL)

    def _finish(self, sweep: SweepRecord, trials: list[optuna.trial.FrozenTrial]) -> None:
        completed = [t for t in trials if t.state == TrialState.COMPLETE]
        best = min(completed, key=lambda t: t.value if t.value is not None else math.inf, default=None)
        pruned = sum(t.state == TrialState.PRUNED for t in trials)
        if best is None:
            state, reason = sweeps_pb2.SWEEP_FAILED, "no trial completed"
        else:
            state = sweeps_pb2.SWEEP_SUCCEEDED
            reason = f"best: trial {best.number}, validation loss {best.value:.4g} ({pruned} of {len(trials)} pruned)"

        def record() -> None:
            details: dict[str, object] = {"state": sweeps_pb2.SweepState.Name(state), "pruned": pruned}
            if best is not None:
                details |= {"best_trial": best.number, "best_job": best.user_attrs.get(JOB_ATTR, "")}
            self._audit.append("server", Action.SWEEP_FINISHED, resource=sweep.id, tenant=sweep.tenant, details=details)

        self._sweeps.end(sweep.id, state, reason, before=record)
        self._sweeps.settle(sweep.id)
        self._studies.pop(sweep.id, None)


def _running(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]


def submit_from_thread(loop: asyncio.AbstractEventLoop, coroutine, timeout: float = 120.0):
    """Run ``coroutine`` on ``loop`` (the server's) from this thread; its result."""
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)
