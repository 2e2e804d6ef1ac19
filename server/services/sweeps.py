"""Sweeps: submit, get, list, cancel. Scoped to the caller's tenant; the trials run in :mod:`cantata.server.sweeps`."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from cantata.proto.v1 import common_pb2, sweeps_pb2, sweeps_pb2_grpc
from cantata.proto.vocabulary import REQUEST_ID_RULE, valid_request_id
from cantata.security.audit import Action, AuditLogUnavailable, Outcome
from cantata.server.auth import caller
from cantata.server.datasource_store import DataSourceNotFound
from cantata.server.errors import InvalidRequest
from cantata.server.jobs.jobspec import InvalidField, job_sources, parse_job_spec
from cantata.server.network.ports import DataSourceDirectory
from cantata.server.request_audit import RequestAudit
from cantata.server.store import RequestIdReused
from cantata.server.sweeps import space
from cantata.server.sweeps.runner import JOB_ATTR, REASON_ATTR
from cantata.server.sweeps.store import SweepRecord, SweepStore

REFUSALS = (InvalidRequest, InvalidField, DataSourceNotFound, RequestIdReused)


def check_job(spec: common_pb2.JobSpec, tenant: str, defaults: dict, data_sources: DataSourceDirectory):
    """``spec`` as a job of ``tenant`` would be stored, or why it may not be (as ``SubmitJob`` checks it)."""
    parsed = parse_job_spec(spec, **defaults)
    for field, source in job_sources(parsed).items():  # another tenant's source is not found either
        if not data_sources.exists(tenant, source):
            raise DataSourceNotFound(f"{field}: data source {source!r} not found")
    return parsed


def trials(storage: optuna.storages.BaseStorage, sweep_id: str) -> list[sweeps_pb2.Trial]:
    """The sweep's trials as Optuna stores them (none before the runner's first pass over the sweep)."""
    try:
        study_id = storage.get_study_id_from_name(sweep_id)
    except KeyError:
        return []
    out = []
    for t in storage.get_all_trials(study_id, deepcopy=False):
        job_id = t.user_attrs.get(JOB_ATTR, "")
        state = "WAITING" if t.state == TrialState.RUNNING and not job_id else t.state.name
        step = t.last_step if t.last_step is not None else 0
        value = t.value if t.value is not None else t.intermediate_values.get(step, 0.0)
        out.append(
            sweeps_pb2.Trial(
                number=t.number,
                job_id=job_id,
                params={k: space.shown(v) for k, v in t.params.items()},
                state=state,
                value=value,
                step=step,
                reason=t.user_attrs.get(REASON_ATTR, ""),
            )
        )
    return out


def sweep_info(sweep: SweepRecord, trials: list[sweeps_pb2.Trial] | None = None) -> sweeps_pb2.SweepInfo:
    info = sweeps_pb2.SweepInfo(
        id=sweep.id,
        tenant=sweep.tenant,
        spec=sweep.spec,
        state=sweeps_pb2.SweepState.ValueType(sweep.state),
        reason=sweep.reason,
        trials=trials or [],
        request_id=sweep.request_id,
        best_trial=min(
            (t for t in trials or [] if t.state == "COMPLETE"),
            key=lambda t: t.value,
            default=sweeps_pb2.Trial(number=-1),
        ).number,
    )
    info.created.FromDatetime(dt.datetime.fromisoformat(sweep.created_at))
    info.updated.FromDatetime(dt.datetime.fromisoformat(sweep.updated_at))
    return info


class SweepsService(sweeps_pb2_grpc.SweepsServicer):
    def __init__(
        self,
        sweeps: SweepStore,
        storage: optuna.storages.BaseStorage,
        spec_defaults: Callable[[str], dict],
        audit: RequestAudit,
        data_sources: DataSourceDirectory,
    ):
        self._sweeps = sweeps
        self._storage = storage
        self._spec_defaults = spec_defaults
        self._audit = audit.append
        self._data_sources = data_sources

    def SubmitSweep(self, request, context):
        """Checked whole (the spec, its base job, and a trial's job at the space's first point), then stored with
        its ``sweep_submitted`` record; the runner starts its trials. A refusal is on the record too."""
        who = caller(context)
        try:
            if not valid_request_id(request.request_id):
                raise InvalidField("request_id", REQUEST_ID_RULE)
            spec = space.checked(request.spec)
            defaults = self._spec_defaults(who.name)
            with _in("job"):
                check_job(spec.job, who.name, defaults, self._data_sources)
            first = {field: _first(d) for field, d in space.distributions(spec).items()}
            with _in("parameters"):
                check_job(space.trial_job("sweep-0", spec, 0, first), who.name, defaults, self._data_sources)

            def record(sweep_id: str) -> None:
                self._audit(
                    who.uri,
                    Action.SWEEP_SUBMITTED,
                    resource=sweep_id,
                    tenant=who.name,
                    peer=context.peer(),
                    details={
                        "name": spec.name,
                        "trials": spec.trials,
                        "concurrency": spec.concurrency,
                        "sampler": spec.sampler,
                        "pruner": spec.pruner,
                        "fields": [p.field for p in spec.parameters],
                    },
                )

            sweep, _ = self._sweeps.submit(who.name, request.request_id, spec, record=record)
        except REFUSALS as exc:
            details = {"name": request.spec.name[:128], "error": type(exc).__name__, "message": str(exc)[:500]}
            with contextlib.suppress(AuditLogUnavailable):
                self._audit(
                    who.uri,
                    Action.SWEEP_SUBMITTED,
                    tenant=who.name,
                    outcome=Outcome.REFUSED,
                    details=details,
                    peer=context.peer(),
                )
            raise
        return sweep_info(sweep, trials(self._storage, sweep.id))

    def GetSweep(self, request, context):
        sweep = self._sweeps.sweep(request.sweep_id, tenant=caller(context).name)
        return sweep_info(sweep, trials(self._storage, sweep.id))

    def ListSweeps(self, request, context):
        return sweeps_pb2.ListSweepsReply(sweeps=[sweep_info(s) for s in self._sweeps.sweeps(caller(context).name)])

    def CancelSweep(self, request, context):
        """The sweep ends CANCELLED (audited as asked); the runner then cancels its running trials' jobs."""
        who = caller(context)
        sweep = self._sweeps.sweep(request.sweep_id, tenant=who.name)
        self._sweeps.end(
            sweep.id,
            sweeps_pb2.SWEEP_CANCELLED,
            "cancelled by tenant",
            before=lambda: self._audit(
                who.uri, Action.SWEEP_CANCEL_REQUESTED, resource=sweep.id, tenant=who.name, peer=context.peer()
            ),
        )
        sweep = self._sweeps.sweep(sweep.id)
        return sweep_info(sweep, trials(self._storage, sweep.id))


def _first(distribution: optuna.distributions.BaseDistribution) -> space.Value:
    """The first point of a distribution: its low end, or its first choice."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return distribution.choices[0]  # type: ignore[return-value]
    return distribution.low  # type: ignore[attr-defined]


@contextlib.contextmanager
def _in(prefix: str):
    """An invalid field of a job is named under ``prefix`` (``job.lr``)."""
    try:
        yield
    except InvalidField as exc:
        raise InvalidField(f"{prefix}.{exc.field}", str(exc).partition(": ")[2]) from None
