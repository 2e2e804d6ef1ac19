"""Hyperparameter sweeps: ``client.sweeps.submit(Sweep.from_dict(yaml.safe_load(...)))``.

A sweep tunes job fields over a search space; the server runs it (Optuna's TPE, random or grid sampler, an
ASHA or Hyperband pruner on the trials' validation losses) and goes on without the client. Each trial is an
ordinary job of the tenant, tagged ``sweep=<id>`` (``client.list(tag=...)`` finds them).
"""

from __future__ import annotations

import math
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from cantata.proto.v1 import common_pb2, sweeps_pb2
from cantata.sdk.errors import InvalidArgument, WaitTimedOut
from cantata.sdk.job import Job
from cantata.sdk.resource import Resource

STATES = {v: k.removeprefix("SWEEP_") for k, v in sweeps_pb2.SweepState.items()}
SWEEP_KEYS = frozenset(
    {"name", "job", "parameters", "sampler", "pruner", "trials", "concurrency", "seed", "min_resource"}
    | {"reduction_factor", "request_id"}
)
_JOB_FIELDS = common_pb2.JobSpec.DESCRIPTOR.fields_by_name


@dataclass
class Sweep:
    """What to tune (``parameters``: field -> ``{low, high[, log][, step]}`` or ``{choices: [...]}``), over which base
    ``job``, how many ``trials`` with how many at once (``concurrency``), and how (``sampler``, ``pruner``)."""

    job: Job
    parameters: Mapping[str, Mapping[str, Any]]
    trials: int
    name: str = ""
    sampler: str = "tpe"
    pruner: str = "asha"
    concurrency: int = 2
    seed: int = 0
    min_resource: int = 0  # the pruner's first rung in steps; 0: the job's eval_every
    reduction_factor: int = 0  # 0: 3
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sweep:
        """From a mapping (a sweep.yaml): the keys above, ``job`` a mapping of job fields; unknown keys refused."""
        unknown = sorted(set(data) - SWEEP_KEYS, key=str)
        if unknown:
            raise InvalidArgument(
                f"unknown sweep keys: {', '.join(map(str, unknown))} (known: {', '.join(sorted(SWEEP_KEYS))})"
            )
        if not isinstance(data.get("job"), Mapping) or not isinstance(data.get("parameters"), Mapping):
            raise InvalidArgument("a sweep needs `job:` (a mapping of job fields) and `parameters:` (field -> space)")
        job = dict(data["job"])
        job.setdefault("name", data.get("name") or "sweep")
        return cls(**{**data, "job": Job.from_dict(job)})

    def to_proto(self) -> sweeps_pb2.SweepSpec:
        spec = sweeps_pb2.SweepSpec(
            name=self.name,
            job=self.job.to_proto(),
            sampler=self.sampler,
            pruner=self.pruner,
            trials=self.trials,
            concurrency=self.concurrency,
            seed=self.seed,
            min_resource=self.min_resource,
            reduction_factor=self.reduction_factor,
        )
        for name, space in self.parameters.items():
            spec.parameters.append(_parameter(str(name), space))
        return spec


def _parameter(name: str, space: Mapping[str, Any]) -> sweeps_pb2.SweepParameter:
    """One field's space: choices, or a range whose kind is the field's (a float field's range is continuous)."""
    where = f"parameters.{name}"
    if not isinstance(space, Mapping):
        raise InvalidArgument(f"{where}: give {{low, high}} or {{choices: [...]}}")
    extra = set(space) - {"low", "high", "log", "step", "choices"}
    if extra:
        raise InvalidArgument(f"{where}: unknown keys {', '.join(sorted(map(str, extra)))}")
    if "choices" in space:
        return sweeps_pb2.SweepParameter(
            field=name, choices=sweeps_pb2.Choices(values=[str(v) for v in space["choices"]])
        )
    try:
        low, high = space["low"], space["high"]
        if name in _JOB_FIELDS and _JOB_FIELDS[name].type == FieldDescriptor.TYPE_DOUBLE:
            return sweeps_pb2.SweepParameter(
                field=name,
                float_range=sweeps_pb2.FloatRange(low=float(low), high=float(high), log=bool(space.get("log"))),
            )
        return sweeps_pb2.SweepParameter(
            field=name,
            int_range=sweeps_pb2.IntRange(
                low=int(low), high=int(high), step=int(space.get("step", 0)), log=bool(space.get("log"))
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"{where}: give numbers low and high ({exc})") from None


@dataclass(frozen=True)
class TrialInfo:
    number: int
    job_id: str
    params: dict[str, str]
    state: str  # WAITING, RUNNING, COMPLETE, PRUNED, FAIL
    value: float | None  # the final validation loss (COMPLETE), else the last reported one
    step: int
    reason: str

    @classmethod
    def from_proto(cls, t: sweeps_pb2.Trial) -> TrialInfo:
        value = t.value if t.step or t.state == "COMPLETE" else None
        return cls(t.number, t.job_id, dict(sorted(t.params.items())), t.state, value, t.step, t.reason)


@dataclass(frozen=True)
class SweepStatus:
    id: str
    name: str
    state: str  # RUNNING, SUCCEEDED, FAILED, CANCELLED
    reason: str
    trials_wanted: int
    concurrency: int
    trials: tuple[TrialInfo, ...]
    best: TrialInfo | None
    created: str
    fields: tuple[str, ...]

    @property
    def terminal(self) -> bool:
        return self.state != "RUNNING"

    def count(self, state: str) -> int:
        return sum(t.state == state for t in self.trials)

    @classmethod
    def from_proto(cls, info: sweeps_pb2.SweepInfo) -> SweepStatus:
        trials = tuple(TrialInfo.from_proto(t) for t in info.trials)
        best = next((t for t in trials if t.number == info.best_trial), None)
        return cls(
            info.id,
            info.spec.name,
            STATES.get(info.state, "UNKNOWN"),
            info.reason,
            info.spec.trials,
            info.spec.concurrency,
            trials,
            best,
            info.created.ToJsonString(),
            tuple(p.field for p in info.spec.parameters),
        )


class Sweeps(Resource):
    """``client.sweeps``: submit, get, list, cancel and wait for sweeps."""

    def submit(self, sweep: Sweep) -> SweepStatus:
        """Submit ``sweep``; the same ``request_id`` submits it once (a retry returns the first)."""
        request = sweeps_pb2.SubmitSweepRequest(spec=sweep.to_proto(), request_id=sweep.request_id)
        return SweepStatus.from_proto(self._call(self._client._sweeps.SubmitSweep, request))

    def get(self, sweep_id: str) -> SweepStatus:
        return SweepStatus.from_proto(
            self._call(self._client._sweeps.GetSweep, sweeps_pb2.GetSweepRequest(sweep_id=sweep_id))
        )

    def list(self) -> list[SweepStatus]:
        """Your sweeps, newest first (without their trials: ``get`` one for them)."""
        reply = self._call(self._client._sweeps.ListSweeps, sweeps_pb2.ListSweepsRequest())
        return [SweepStatus.from_proto(s) for s in reply.sweeps]

    def cancel(self, sweep_id: str) -> SweepStatus:
        """End the sweep: its running trials' jobs are cancelled, no new trial starts."""
        return SweepStatus.from_proto(
            self._call(self._client._sweeps.CancelSweep, sweeps_pb2.CancelSweepRequest(sweep_id=sweep_id))
        )

    def wait(
        self,
        sweep_id: str,
        *,
        timeout: float | None = None,
        poll: float = 1.0,
        on_change: Callable[[SweepStatus], object] | None = None,
    ) -> SweepStatus:
        """Poll the sweep until it ends; ``on_change`` sees each new status; past ``timeout``, ``WaitTimedOut``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            status = self.get(sweep_id)
            if on_change is not None and status != last:
                on_change(status)
            last = status
            if status.terminal:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimedOut(f"sweep {sweep_id} still {status.state} after {timeout} s")
            time.sleep(poll)


def progress_line(status: SweepStatus) -> str:
    """One line: trials done, pruned, running, and the best so far."""
    best = f", best trial {status.best.number} val {status.best.value:.4f}" if status.best and status.best.value else ""
    done = sum(t.state in ("COMPLETE", "PRUNED", "FAIL") for t in status.trials)
    return (
        f"{status.id} {status.state}: {done}/{status.trials_wanted} trials done "
        f"({status.count('COMPLETE')} complete, {status.count('PRUNED')} pruned, {status.count('FAIL')} failed), "
        f"{status.count('RUNNING') + status.count('WAITING')} running{best}"
    )


def trials_table(status: SweepStatus) -> list[str]:
    """The results table: one row per trial, best first among the completed, then by number."""
    fields = list(status.fields)
    header = ["#", "state", "val_loss", "step", *fields, "job"]
    order = sorted(
        status.trials, key=lambda t: (t.state != "COMPLETE", t.value if t.value is not None else math.inf, t.number)
    )
    rows = [
        [
            ("*" if status.best is not None and t.number == status.best.number else "") + str(t.number),
            t.state,
            f"{t.value:.4f}" if t.value is not None else "-",
            str(t.step),
            *(t.params.get(f, "") for f in fields),
            t.job_id or "-",
        ]
        for t in order
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def print_progress(status: SweepStatus) -> None:
    print(progress_line(status), file=sys.stderr, flush=True)
