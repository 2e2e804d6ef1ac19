"""A sweep's spec checked, and in Optuna's terms: distributions, sampler, pruner, and a trial's job spec."""

from __future__ import annotations

import math
from collections.abc import Mapping

import optuna
from google.protobuf.descriptor import FieldDescriptor

from cantata.proto.v1 import common_pb2, sweeps_pb2
from cantata.server.errors import InvalidRequest

# The job fields a sweep may tune: training settings, never what names, places or stores the job.
TUNABLE = frozenset(
    {
        "lr",
        "warmup_steps",
        "weight_decay",
        "min_lr_ratio",
        "grad_clip",
        "lr_schedule",
        "optimizer",
        "batch_size",
        "grad_accum",
        "seq_len",
        "seed",
        "local_steps",
        "outer_lr",
        "outer_momentum",
        "gossip_step",
        "muon_momentum",
    }
)
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("asha", "hyperband", "none")
MAX_TRIALS = 1000
MAX_CONCURRENCY = 64
MAX_PARAMETERS = 16
MAX_CHOICES = 64
DEFAULT_CONCURRENCY = 2
DEFAULT_REDUCTION = 3
SWEEP_TAG = "sweep="  # + the sweep id: the tag of each of its trials' jobs

Value = float | int | str
_FIELDS = common_pb2.JobSpec.DESCRIPTOR.fields_by_name
_FLOATS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}
_INTS = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64}


def _kind(field: str) -> type:
    kind = _FIELDS[field].type
    return float if kind in _FLOATS else int if kind in _INTS else str


def checked(spec: sweeps_pb2.SweepSpec) -> sweeps_pb2.SweepSpec:
    """``spec`` with its defaults filled in, or :class:`~cantata.server.errors.InvalidRequest` naming what is wrong
    (the base job itself is checked as a job is, by the caller)."""
    out = sweeps_pb2.SweepSpec()
    out.CopyFrom(spec)
    out.sampler = spec.sampler or "tpe"
    out.pruner = spec.pruner or "asha"
    out.concurrency = spec.concurrency or DEFAULT_CONCURRENCY
    out.reduction_factor = spec.reduction_factor or DEFAULT_REDUCTION
    out.seed = spec.seed or 1
    out.min_resource = spec.min_resource or spec.job.eval_every
    out.name = spec.name or spec.job.name or "sweep"
    _require(out.sampler in SAMPLERS, "sampler", f"must be one of {', '.join(SAMPLERS)}")
    _require(out.pruner in PRUNERS, "pruner", f"must be one of {', '.join(PRUNERS)}")
    _require(1 <= out.trials <= MAX_TRIALS, "trials", f"must be 1..{MAX_TRIALS}")
    _require(1 <= out.concurrency <= MAX_CONCURRENCY, "concurrency", f"must be 1..{MAX_CONCURRENCY}")
    _require(out.reduction_factor >= 2, "reduction_factor", "must be at least 2")
    _require(out.min_resource >= 0, "min_resource", "must be >= 0")
    _require(spec.job.eval_every > 0, "job.eval_every", "must be set: trials are compared on their validation loss")
    _require(out.seed > 0, "seed", "must be > 0")
    _require(1 <= len(spec.parameters) <= MAX_PARAMETERS, "parameters", f"give 1..{MAX_PARAMETERS}")
    seen: set[str] = set()
    for i, parameter in enumerate(spec.parameters):
        _check_parameter(parameter, f"parameters[{i}]")
        _require(parameter.field not in seen, f"parameters[{i}].field", f"{parameter.field} is tuned twice")
        seen.add(parameter.field)
    if out.sampler == "grid":
        size = math.prod(len(values) for values in grid(out).values())
        _require(out.trials <= size, "trials", f"the grid has {size} points: a grid sweep runs at most that many")
    return out


def _check_parameter(p: sweeps_pb2.SweepParameter, where: str) -> None:
    _require(p.field in TUNABLE, f"{where}.field", f"{p.field!r} is not tunable (one of {', '.join(sorted(TUNABLE))})")
    kind, space = _kind(p.field), p.WhichOneof("space")
    if space == "float_range":
        r = p.float_range
        _require(kind is float, where, f"{p.field} is not a float field: give int_range or choices")
        _require(math.isfinite(r.low) and math.isfinite(r.high) and r.low < r.high, where, "needs low < high, finite")
        _require(not r.log or r.low > 0, where, "a log range needs low > 0")
    elif space == "int_range":
        r = p.int_range
        _require(kind is not str, where, f"{p.field} takes text: give choices")
        _require(r.low < r.high and r.step >= 0, where, "needs low < high and step >= 0")
        _require(not r.log or (r.low >= 1 and r.step <= 1), where, "a log range needs low >= 1 and step 1")
        _require((r.high - r.low) // (r.step or 1) < 100_000, where, "too many values")
    elif space == "choices":
        values = p.choices.values
        _require(1 <= len(values) <= MAX_CHOICES, where, f"give 1..{MAX_CHOICES} choices")
        _require(len(set(values)) == len(values), where, "choices repeat")
        for value in values:
            _typed(p.field, value, where)
    else:
        _require(False, where, "give float_range, int_range or choices")


def _typed(field: str, text: str, where: str) -> Value:
    kind = _kind(field)
    try:
        value = kind(text)
    except ValueError:
        raise InvalidRequest(f"{where}: {text!r} is not a {kind.__name__} for {field}", field=where) from None
    _require(not isinstance(value, float) or math.isfinite(value), where, f"{text!r} is not finite")
    return value


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise InvalidRequest(f"{field}: {message}", field=field)


def distributions(spec: sweeps_pb2.SweepSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    """Each tuned field's Optuna distribution."""
    out: dict[str, optuna.distributions.BaseDistribution] = {}
    for p in spec.parameters:
        space = p.WhichOneof("space")
        if space == "float_range":
            out[p.field] = optuna.distributions.FloatDistribution(
                p.float_range.low, p.float_range.high, log=p.float_range.log
            )
        elif space == "int_range":
            r = p.int_range
            out[p.field] = optuna.distributions.IntDistribution(r.low, r.high, log=r.log, step=r.step or 1)
        else:
            out[p.field] = optuna.distributions.CategoricalDistribution(
                [_typed(p.field, v, p.field) for v in p.choices.values]
            )
    return out


def grid(spec: sweeps_pb2.SweepSpec) -> dict[str, list[Value]]:
    """The grid sampler's points per field (choices and int ranges only: a float range has no grid)."""
    out: dict[str, list[Value]] = {}
    for i, p in enumerate(spec.parameters):
        space = p.WhichOneof("space")
        if space == "choices":
            out[p.field] = [_typed(p.field, v, p.field) for v in p.choices.values]
        elif space == "int_range" and not p.int_range.log:
            r = p.int_range
            out[p.field] = list(range(r.low, r.high + 1, r.step or 1))
        else:
            _require(False, f"parameters[{i}]", "a grid sweep takes choices and linear int ranges only")
    return out


def sampler(spec: sweeps_pb2.SweepSpec) -> optuna.samplers.BaseSampler:
    if spec.sampler == "grid":
        return optuna.samplers.GridSampler(grid(spec), seed=spec.seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed)


def pruner(spec: sweeps_pb2.SweepSpec) -> optuna.pruners.BasePruner:
    if spec.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec.min_resource, reduction_factor=spec.reduction_factor
        )
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=spec.min_resource,
            max_resource=spec.job.steps or "auto",
            reduction_factor=spec.reduction_factor,
        )
    return optuna.pruners.NopPruner()


def trial_job(
    sweep_id: str, spec: sweeps_pb2.SweepSpec, number: int, params: Mapping[str, Value]
) -> common_pb2.JobSpec:
    """The job of trial ``number``: the base job with the trial's values, named after it, tagged with the sweep."""
    job = common_pb2.JobSpec()
    job.CopyFrom(spec.job)
    for field, value in params.items():
        setattr(job, field, value)
    job.name = f"{spec.name}-t{number}"
    job.tags.append(SWEEP_TAG + sweep_id)
    return job


def shown(value: Value) -> str:
    """A trial's value as text (the params map of a trial)."""
    return format(value, ".6g") if isinstance(value, float) else str(value)
