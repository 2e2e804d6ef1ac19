"""The job fields, in one table: it drives the SDK ``Job``, the ``jobs submit`` flags, the server's checks and the docs.

Each ``JobSpec`` field has one row: its Python type, the SDK's default, the
server's default (a value, or a :class:`Rule` computed from other fields), the
range or choices of a set value, the algorithms it applies to and its help
text. A field is *unset* when it holds its type's zero (``""``, ``0``,
``False``), or, for proto3 ``optional`` fields, when it is absent (an explicit
0 is then a value). Rules that tie fields together (``single`` runs one
worker, diloco's fixed graph, the process limit) and the checks of dataset and
store locations stay explicit code in :mod:`cantata.server.jobs.jobspec`.

    python -m cantata.proto.jobfields --write docs   # regenerate docs/job.schema.json and docs/job-fields.md
    python -m cantata.proto.jobfields --check docs   # exit 1 if they are stale
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import (
    DECENTRALIZED,
    REQUEST_ID,
    Algorithm,
    Compression,
    CostUnit,
    LrSchedule,
    MixedPrecision,
    Model,
    NsDtype,
    OnNonfinite,
    Optimizer,
    PipelineSchedule,
    Topology,
    Utf8Policy,
)
from cantata.storage import uri as stores

MAX_STEPS = 10_000_000
MAX_WORKERS = 256  # worker processes of one job, all groups together
MAX_RANKS_PER_WORKER = 64
MAX_GPUS_PER_WORKER = 16
MAX_FAILURES, DEFAULT_MAX_FAILURES = 100, 3
MAX_TAGS = 16
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,63}")
WARMUP_DIVISOR = 20  # the default warm-up: 5% of the steps
MAX_GRAD_ACCUM = 1024
MAX_EVAL_BATCHES = 10_000
MAX_KEEP_LAST = 10_000
TOKENIZER_PREFIX = "sha256:"
MAX_VOCAB = 1 << 24
DECENTRALIZED_DEFAULTS = {  # algorithm -> (local steps H, outer lr eta, outer momentum gamma, topology)
    Algorithm.DILOCO: (20, 0.7, 0.9, Topology.COMPLETE),
    Algorithm.GASLOC: (20, 1.0, 0.5, Topology.RING),
}
ROUND_DEADLINE_BOUNDS = (2.0, 120.0)  # an adaptive round deadline stays within these seconds
REQUIRED = dataclasses.MISSING  # an SDK default meaning "no default: the caller must give one"
# ``tuple`` is a list of strings (a proto ``repeated string``); each item is checked by ``pattern``.
TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", tuple: "a list of strings"}
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", tuple: "array"}
KIND_NAMES = {str: "str", int: "int", float: "float", bool: "bool", tuple: "list of str"}


@dataclasses.dataclass(frozen=True)
class Rule:
    """A server default computed from the other fields; ``compute`` None: the server fills it from its settings."""

    text: str
    compute: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Range:
    """The finite numbers from ``low`` to ``high`` (None: unbounded), each end open or closed."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def text(self, integer: bool) -> str:
        if integer and self.high is not None:
            return f"{self.low}..{self.high}"
        if integer:
            return f">= {self.low}"
        if self.high is None:
            return f"a finite number {'>' if self.low_open else '>='} {self.low}"
        return f"a number in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


@dataclasses.dataclass(frozen=True)
class JobField:
    """One row of the table (see the module docstring)."""

    name: str
    kind: type  # the Python type: str, int, float, bool, or tuple for a list of strings
    help: str
    sdk_default: Any
    server_default: Any = None  # a value, a Rule, or None: an unset value stays unset
    range: Range | None = None
    choices: type[enum.StrEnum] | None = None
    prefixes: tuple[str, ...] = ()  # a set string value starts with one of these
    max_length: int | None = None  # a set string value is 1..max_length printable characters
    pattern: re.Pattern[str] | None = None  # each item of a list must match it in full
    max_items: int | None = None  # a list holds at most this many distinct items
    flag: str = ""  # the CLI flag when it is not --NAME (a list's flag is given once per item)
    algorithms: frozenset[Algorithm] = frozenset(Algorithm)
    optional: bool = False  # proto3 optional: unset is None, and an explicit 0 is a value
    required: bool = False  # the server refuses it unset

    @property
    def zero(self) -> Any:
        """The unset value: None for optional fields, else the type's zero."""
        return None if self.optional else self.kind()

    @property
    def sdk_unset_ok(self) -> bool:
        """Whether the SDK lets this field stay unset (its default is the unset value)."""
        return self.sdk_default is not REQUIRED and self.sdk_default == self.zero

    def default_text(self) -> str:
        """What an omitted field becomes, in words."""
        if self.sdk_default is REQUIRED:
            return "required"
        if not self.sdk_unset_ok:
            return _text(self.sdk_default)
        if isinstance(self.server_default, Rule):
            return self.server_default.text
        return _text(self.server_default) if self.server_default is not None else _text(self.zero)

    def applies_text(self) -> str:
        """The algorithms the field applies to, in words."""
        if self.algorithms == frozenset(Algorithm):
            return "all"
        return " and ".join(a for a in Algorithm if a in self.algorithms)

    def allowed_text(self) -> str:
        """The values a set field may take, in words."""
        if self.choices is not None:
            return ", ".join(self.choices)
        if self.pattern is not None:
            return f"up to {self.max_items} distinct, each matching {self.pattern.pattern}"
        if self.range is not None:
            return self.range.text(self.kind is int)
        if self.prefixes:
            return " ".join(f"{p}..." for p in self.prefixes)
        if self.max_length is not None:
            return f"1-{self.max_length} printable characters"
        return ""


def _text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(value) + "]"
    return str(value) if value != "" else '""'


def _decentralized(index: int) -> Callable[[Any], Any]:
    return lambda spec: DECENTRALIZED_DEFAULTS[spec.algorithm][index]


# Training settings: the schedule, regularisation, accumulation, evaluation and retention.
TRAINING_FIELDS: tuple[JobField, ...] = (
    JobField(
        "warmup_steps",
        int,
        "steps of linear learning-rate warm-up from 0; 0 is none",
        None,
        Rule("steps / 20, at least 1", lambda spec: max(1, spec.steps // WARMUP_DIVISOR)),
        range=Range(0, MAX_STEPS),
        optional=True,
    ),
    JobField(
        "lr_schedule",
        str,
        "decay of the learning rate after warm-up, to min_lr_ratio x lr at the last step",
        "",
        LrSchedule.COSINE.value,
        choices=LrSchedule,
    ),
    JobField(
        "min_lr_ratio",
        float,
        "the decay's floor, as a fraction of lr",
        None,
        0.1,
        range=Range(0, 1),
        optional=True,
    ),
    JobField(
        "weight_decay",
        float,
        "decoupled weight decay of weight matrices (norms and biases never decay)",
        None,
        0.1,
        range=Range(0, 1),
        optional=True,
    ),
    JobField(
        "grad_clip",
        float,
        "clip the global gradient norm (after averaging across workers) to this; unset: no clipping",
        0.0,
        range=Range(0, low_open=True),
    ),
    JobField(
        "grad_accum",
        int,
        "micro-batches of batch_size accumulated per optimizer step",
        0,
        1,
        range=Range(1, MAX_GRAD_ACCUM),
    ),
    JobField(
        "eval_batches",
        int,
        "validation batches of batch_size per evaluation (the dataset's validation split must hold them)",
        0,
        8,
        range=Range(1, MAX_EVAL_BATCHES),
    ),
    JobField(
        "keep_last",
        int,
        "checkpoints kept in the store; older ones are deleted once a newer one is written",
        0,
        3,
        range=Range(1, MAX_KEEP_LAST),
    ),
    JobField(
        "async_checkpoint",
        bool,
        "upload checkpoints in the background: training goes on after a copy of the state to host memory (which "
        "needs room for one more copy of the model and optimizer), and the checkpoint exists once every object "
        "is stored",
        False,
    ),
)

_MESH = frozenset({Algorithm.SINGLE, Algorithm.ALLREDUCE})
# Tokenizer, mesh and initial weights (issue 19). The mesh of an allreduce job's workers:
# workers = dp_replicate x dp_shard x tp; a decentralized job's worker groups: dp_shard = ranks_per_worker
# (checked in cantata.server.jobs.jobspec).
MODEL_FIELDS: tuple[JobField, ...] = (
    JobField(
        "tokenizer",
        str,
        "sha256:HEX of the tokenizer.json the dataset was prepared with (`cantata data prepare --tokenizer` "
        "prints it); every shard must record it",
        "",
        prefixes=(TOKENIZER_PREFIX,),
        max_length=len(TOKENIZER_PREFIX) + 64,
    ),
    JobField(
        "tokenizer_vocab",
        int,
        "the tokenizer's vocabulary size (with tokenizer); at most the model's vocabulary",
        0,
        range=Range(1, MAX_VOCAB),
    ),
    JobField(
        "dp_shard",
        int,
        "ranks each parameter, gradient and optimizer state is sharded over (FSDP2); decoder models. "
        "gasloc/diloco: equal to ranks_per_worker, each worker group is sharded and every rank gossips its shard",
        0,
        1,
        range=Range(1, MAX_WORKERS),
    ),
    JobField(
        "tp",
        int,
        "tensor-parallel ranks (column/row-parallel attention and MLP); must divide the key/value heads",
        0,
        1,
        range=Range(1, MAX_WORKERS),
        algorithms=_MESH,
    ),
    JobField(
        "dp_replicate",
        int,
        "replicas of the sharded model (HSDP: sharded inside a replica, averaged across)",
        0,
        1,
        range=Range(1, MAX_WORKERS),
        algorithms=_MESH,
    ),
    JobField("activation_checkpointing", bool, "recompute each decoder layer in the backward pass", False),
    JobField(
        "mixed_precision",
        str,
        "compute dtype of a sharded model (gradients are reduced in fp32)",
        "",
        MixedPrecision.FP32.value,
        choices=MixedPrecision,
        algorithms=_MESH,
    ),
    JobField(
        "init_from",
        str,
        "initial weights: a .safetensors file or object, or a directory or prefix of them (Hugging Face names; a Llama/Qwen3 folder's config.json must be the job's model): "
        "file:///PATH under an allowed root, s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix through "
        "one of your data sources; loaded one at a time, each rank keeping its shard",
        "",
        prefixes=stores.prefixes(),
    ),
)


def _with_muon(value: Any) -> Rule:
    return Rule(f"{_text(value)} with muon", lambda spec: value if spec.optimizer == Optimizer.MUON else None)


MAX_BUCKET_ELEMENTS = 10**10
# Muon and Canzona (optimizer "muon" only; the server refuses them with "adamw").
MUON_FIELDS: tuple[JobField, ...] = (
    JobField(
        "canzona_alpha",
        float,
        "Canzona's balance of its ownership plan: 1 balances Newton-Schulz compute across ranks, 0 communication",
        None,
        _with_muon(1.0),
        range=Range(0, 1),
        optional=True,
    ),
    JobField(
        "canzona_bucket_elements",
        int,
        "elements per gradient bucket of Canzona's plan (parameters are never split)",
        0,
        _with_muon(40_000_000),
        range=Range(1, MAX_BUCKET_ELEMENTS),
    ),
    JobField(
        "canzona_cost_unit",
        str,
        "how Canzona weighs a matrix: Newton-Schulz FLOPs, or elements as the authors' code does",
        "",
        _with_muon(CostUnit.FLOPS.value),
        choices=CostUnit,
    ),
    JobField(
        "muon_momentum",
        float,
        "Muon's (Nesterov) momentum",
        None,
        _with_muon(0.95),
        range=Range(0, 1, high_open=True),
        optional=True,
    ),
    JobField("muon_ns_steps", int, "Newton-Schulz iterations per update", 0, _with_muon(5), range=Range(1, 99)),
    JobField(
        "muon_ns_dtype",
        str,
        "precision of the Newton-Schulz iteration (bfloat16 as on GPUs; float32 reproduces exactly)",
        "",
        _with_muon(NsDtype.FLOAT32.value),
        choices=NsDtype,
    ),
)

# Where a job's workers run (issue 18) and how fast they train there (issue 35).
PLACEMENT_FIELDS: tuple[JobField, ...] = (
    JobField(
        "gpus_per_worker",
        int,
        "GPUs each worker process gets (its CUDA_VISIBLE_DEVICES); 0 trains on the CPU",
        0,
        0,
        range=Range(1, MAX_GPUS_PER_WORKER),
    ),
)

MAX_ROLLBACKS = 100
DEFAULT_SPIKE_WINDOW = 50
# Automatic recovery (issue 36): single and allreduce jobs roll back to their latest checkpoint
# (cantata.trainer.recovery); a decentralized worker's state is its peers' too, so gasloc and diloco refuse them.
RECOVERY_FIELDS: tuple[JobField, ...] = (
    JobField(
        "on_nonfinite",
        str,
        "a step whose loss is NaN or infinite: warn and train on, roll back to the latest checkpoint "
        "(skipping the data since), or fail the job",
        "",
        OnNonfinite.WARN.value,
        choices=OnNonfinite,
        algorithms=_MESH,
    ),
    JobField(
        "spike_zscore",
        float,
        "roll back to the latest checkpoint (skipping the data since) when a step's loss lies this many standard "
        "deviations above the mean of the last spike_window losses; unset: no spike detection",
        None,
        range=Range(0, 1000, low_open=True),
        algorithms=_MESH,
        optional=True,
    ),
    JobField(
        "spike_window",
        int,
        "the losses spike_zscore compares a step's loss with (with spike_zscore; detection starts once it is full)",
        None,
        Rule(
            f"{DEFAULT_SPIKE_WINDOW} with spike_zscore",
            lambda spec: DEFAULT_SPIKE_WINDOW if spec.HasField("spike_zscore") else None,
        ),
        range=Range(2, 10_000),
        algorithms=_MESH,
        optional=True,
    ),
    JobField(
        "max_rollbacks",
        int,
        "rollbacks one run of the workers survives; the next loss spike or non-finite loss fails the job",
        None,
        3,
        range=Range(0, MAX_ROLLBACKS),
        algorithms=_MESH,
        optional=True,
    ),
    JobField(
        "rollback_lr_scale",
        float,
        "the learning rate's factor after each rollback (0.5: halved after the first, quartered after the second)",
        None,
        1.0,
        range=Range(0, 1, low_open=True),
        algorithms=_MESH,
        optional=True,
    ),
)

# Training speed on GPUs (issue 35): cantata.trainer.regional_compile and cantata.trainer.float8.
SPEED_FIELDS: tuple[JobField, ...] = (
    JobField(
        "compile",
        bool,
        "torch.compile each transformer block (regional compilation): faster steps after a first step that compiles",
        False,
    ),
    JobField(
        "float8",
        bool,
        "float8 matmuls in training (torchao) on NVIDIA GPUs of compute capability 8.9 or newer "
        "(H100, H200, L40S); refused for a job that would train on the CPU",
        False,
    ),
    JobField(
        "pp",
        int,
        "pipeline-parallel ranks (torch.distributed.pipelining): the decoder's layers split into stages, "
        "workers = pp x dp_shard x tp (each stage sharded with FSDP2 and tensor parallelism); untied Llama/Qwen3 "
        "decoders, not yet with dp_replicate",
        0,
        1,
        range=Range(1, MAX_WORKERS),
        algorithms=_MESH,
    ),
    JobField(
        "pp_schedule",
        str,
        "the pipeline's schedule: 1f1b (one stage per rank) or interleaved-1f1b (two stages per rank)",
        "",
        PipelineSchedule.ONE_F_ONE_B.value,
        choices=PipelineSchedule,
        algorithms=_MESH,
    ),
    JobField(
        "pp_microbatches",
        int,
        "micro-batches each batch is split into through the pipeline (with pp > 1); must divide batch_size",
        0,
        Rule("the pipeline's stages, with pp > 1", lambda spec: pipeline_stages(spec) if spec.pp > 1 else None),
        range=Range(1, MAX_WORKERS),
        algorithms=_MESH,
    ),
)


def pipeline_stages(spec: Any) -> int:
    """The stages of a job's pipeline: ``pp``, twice that for the interleaved schedule."""
    return spec.pp * (2 if spec.pp_schedule == PipelineSchedule.INTERLEAVED_1F1B else 1)


FIELDS: tuple[JobField, ...] = (
    JobField("name", str, "the job's name, shown in listings", REQUIRED, max_length=128, required=True),
    JobField("model", str, "model configuration", Model.GPT_TINY.value, Model.GPT_TINY.value, choices=Model),
    JobField(
        "dataset",
        str,
        "builtin:pystdlib, file:///DIR under an allowed root, s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix",
        "builtin:pystdlib",
        "builtin:pystdlib",
        prefixes=("builtin:", *stores.prefixes()),
    ),
    JobField(
        "algorithm",
        str,
        "how the workers train together",
        "",
        Rule("allreduce if workers > 1, else single", lambda spec: "allreduce" if spec.workers > 1 else "single"),
        choices=Algorithm,
    ),
    JobField(
        "workers",
        int,
        "worker processes; for gasloc and diloco, worker groups",
        1,
        1,
        range=Range(1, MAX_WORKERS),
    ),
    JobField(
        "topology",
        str,
        "the gossip graph (diloco: always complete)",
        "",
        Rule("ring (gasloc), complete (diloco)", _decentralized(3)),
        choices=Topology,
        algorithms=DECENTRALIZED,
    ),
    JobField(
        "local_steps",
        int,
        "inner steps H between gossip rounds",
        0,
        20,
        range=Range(1, 10_000),
        algorithms=DECENTRALIZED,
    ),
    JobField("optimizer", str, "inner optimizer", Optimizer.ADAMW.value, Optimizer.ADAMW.value, choices=Optimizer),
    JobField("steps", int, "training steps", 300, range=Range(1, MAX_STEPS), required=True),
    JobField(
        "checkpoint_every",
        int,
        "steps between encrypted checkpoints",
        0,
        Rule("min(100, steps)", lambda spec: min(100, spec.steps)),
        range=Range(1),
    ),
    JobField(
        "checkpoint_store",
        str,
        "file:///DIR under an allowed root, s3://bucket/prefix or az://container/prefix",
        "",
        Rule("the server's default store"),
        prefixes=stores.prefixes(),
    ),
    JobField(
        "eval_every",
        int,
        "steps between validation losses",
        0,
        Rule("min(100, steps)", lambda spec: min(100, spec.steps)),
        range=Range(1),
    ),
    JobField("batch_size", int, "sequences per step and worker", 0, 16, range=Range(1, 4096)),
    JobField("seq_len", int, "tokens per sequence", 0, 64, range=Range(1, 1024)),
    JobField(
        "lr",
        float,
        "inner learning rate",
        0.0,
        Rule("0.02 with muon, else 0.003", lambda spec: 0.02 if spec.optimizer == Optimizer.MUON else 3e-3),
        range=Range(0, low_open=True),
    ),
    JobField("seed", int, "random seed of initialization and data order", 0, 1337, range=Range(1)),
    JobField(
        "outer_lr",
        float,
        "outer step eta",
        None,
        Rule("1.0 (gasloc), 0.7 (diloco)", _decentralized(1)),
        range=Range(0, 10, low_open=True),
        algorithms=DECENTRALIZED,
        optional=True,
    ),
    JobField(
        "outer_momentum",
        float,
        "outer momentum gamma; 0 is plain gossip",
        None,
        Rule("0.5 (gasloc), 0.9 (diloco)", _decentralized(2)),
        range=Range(0, 1, high_open=True),
        algorithms=DECENTRALIZED,
        optional=True,
    ),
    JobField(
        "gossip_step",
        float,
        "gasloc mixing step alpha (diloco mixes with 1/workers)",
        None,
        Rule("Metropolis weights 1/(d_max+1), per round"),
        range=Range(0, 1, low_open=True),
        algorithms=DECENTRALIZED,
        optional=True,
    ),
    JobField(
        "compression",
        str,
        "encoding of gossiped updates",
        "",
        Compression.NONE.value,
        choices=Compression,
        algorithms=DECENTRALIZED,
    ),
    JobField("trace_samples", bool, "log every step's sample ids (data lineage; makes the logs large)", False),
    JobField(
        "on_bad_utf8",
        str,
        "dataset text that is not UTF-8: skip it with a warning event, or fail the job",
        "",
        Utf8Policy.SKIP.value,
        choices=Utf8Policy,
    ),
    JobField(
        "ranks_per_worker",
        int,
        "gasloc/diloco: processes per worker group, data parallel inside; single and allreduce jobs must leave it 1",
        0,
        1,
        range=Range(1, MAX_RANKS_PER_WORKER),
    ),
    JobField(
        "min_workers",
        int,
        "quorum: the job fails when fewer worker groups are alive",
        0,
        Rule("a majority, workers // 2 + 1", lambda spec: spec.workers // 2 + 1),
        range=Range(1, MAX_WORKERS),
        algorithms=DECENTRALIZED,
    ),
    JobField(
        "max_failures",
        int,
        "worker failures survived by restarting from the latest checkpoint (gasloc/diloco: restarts per worker); "
        "the server's max_worker_restarts bounds it",
        None,
        DEFAULT_MAX_FAILURES,
        range=Range(0, MAX_FAILURES),
        optional=True,
    ),
    JobField(
        "tags",
        tuple,
        "labels to find the job by (`cantata jobs list --tag`)",
        (),
        pattern=TAG,
        max_items=MAX_TAGS,
        flag="tag",
    ),
    JobField(
        "round_deadline_s",
        float,
        "seconds a gossip round or diloco all-reduce may take before a late peer's edge is dropped",
        None,
        Rule(f"adaptive: 4 x the slowest of the last 8 rounds + 1 s, within {ROUND_DEADLINE_BOUNDS} s"),
        range=Range(0, 3600, low_open=True),
        algorithms=DECENTRALIZED,
        optional=True,
    ),
    JobField(
        "round_time_s",
        float,
        "time budget of each round's inner steps, seconds: each worker runs as many as fit (at least 1), "
        "weighted by steps done in the outer step",
        None,
        Rule("local_steps inner steps per round"),
        range=Range(0, 3600, low_open=True),
        algorithms=DECENTRALIZED,
        optional=True,
    ),
    *TRAINING_FIELDS,
    *MODEL_FIELDS,
    *MUON_FIELDS,
    *PLACEMENT_FIELDS,
    *RECOVERY_FIELDS,
    *SPEED_FIELDS,
)
FIELD = {f.name: f for f in FIELDS}


def value_of(job: Any, f: JobField) -> Any:
    """``f``'s value in a ``Job`` or a ``JobSpec``; None for an absent optional proto field, a tuple for a list."""
    if f.optional and isinstance(job, Message) and not job.HasField(f.name):
        return None
    value = getattr(job, f.name)
    if f.kind is tuple and isinstance(job, Message):
        return tuple(value)
    return value


def is_set(f: JobField, value: Any) -> bool:
    return value is not None if f.optional else bool(value)


def _has_type(f: JobField, value: Any) -> bool:
    if f.kind is tuple:  # a list, a tuple or a proto repeated field, of strings
        return (
            isinstance(value, Iterable)
            and not isinstance(value, str | bytes | Mapping)
            and all(isinstance(v, str) for v in value)
        )
    if f.kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if f.kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, f.kind)


def problem(f: JobField, value: Any, algorithm: str | None, *, unset_ok: bool) -> str | None:
    """Why ``value`` does not fit ``f`` in a job of ``algorithm`` (None: not yet known), or None if it does."""
    if f.optional and value is None and unset_ok:
        return None
    if not _has_type(f, value):
        return f"must be {TYPE_WORDS[f.kind]}"
    if not is_set(f, value) and unset_ok:
        return None
    if algorithm is not None and algorithm not in f.algorithms:
        return "only for " + " or ".join(a for a in Algorithm if a in f.algorithms)
    if f.choices is not None and value not in set(f.choices):
        return f"unknown {f.name} {value!r} (known: {', '.join(f.choices)})"
    if f.range is not None and value not in f.range:
        return f"must be {f.range.text(f.kind is int)}"
    if f.prefixes and not value.startswith(f.prefixes):
        return f"unknown scheme in {value!r} (use {', '.join(f.prefixes)})"
    if f.max_length is not None and not (0 < len(value) <= f.max_length and value.isprintable()):
        return f"1-{f.max_length} printable characters required"
    if f.pattern is not None:
        return _list_problem(f, list(value))
    return None


def _list_problem(f: JobField, items: list[str]) -> str | None:
    assert f.pattern is not None
    if f.max_items is not None and len(items) > f.max_items:
        return f"at most {f.max_items} items, not {len(items)}"
    bad = next((item for item in items if not f.pattern.fullmatch(item)), None)
    if bad is not None:
        return f"{bad!r} does not match {f.pattern.pattern}"
    if len(set(items)) != len(items):
        return "items must be distinct"
    return None


def problems(job: Any, unset_ok: Callable[[JobField], bool]) -> Iterator[tuple[str, str]]:
    """Each field of ``job`` (a ``Job`` or a ``JobSpec``) that the table refuses, as ``(field, why)``.

    ``algorithm`` and ``workers`` are checked first: which fields apply depends on them.
    """
    first = (FIELD["algorithm"], FIELD["workers"])
    for f in first:
        why = problem(f, value_of(job, f), None, unset_ok=unset_ok(f))
        if why:
            yield f.name, why
            return
    algorithm = job.algorithm or FIELD["algorithm"].server_default.compute(job)
    for f in FIELDS:
        why = problem(f, value_of(job, f), algorithm, unset_ok=unset_ok(f))
        if why and f not in first:
            yield f.name, why


def fill_defaults(spec: Any) -> None:
    """Set every unset field of ``spec`` (a ``JobSpec``) that applies to its algorithm to the server's default.

    ``algorithm`` comes first (which fields apply depends on it), then the rest in table order, so that a
    rule sees the fields above it filled in.
    """
    _fill(spec, FIELD["algorithm"])
    for f in FIELDS:
        if spec.algorithm in f.algorithms:
            _fill(spec, f)


def server_default(name: str, **context: Any) -> Any:
    """The value the server fills field ``name`` in with, in a spec of ``context`` (``optimizer="muon"``, ...).

    What code that reads a spec falls back on where a field is unset, so that no default is written twice.
    """
    default = FIELD[name].server_default
    if isinstance(default, Rule):
        if default.compute is None:
            raise ValueError(f"{name}: the server fills it in from its settings")
        default = default.compute(common_pb2.JobSpec(**context))
    return default


def _fill(spec: Any, f: JobField) -> None:
    if is_set(f, value_of(spec, f)):
        return
    default = f.server_default
    if isinstance(default, Rule):
        default = default.compute(spec) if default.compute else None
    if default is not None:
        setattr(spec, f.name, default)


# ---- generated documents --------------------------------------------------
def _sdk_range(f: JobField) -> Range | None:
    """The numbers the SDK accepts: a set value's range, plus 0 where 0 means the default."""
    r = f.range
    if r is None or f.optional or not f.sdk_unset_ok:
        return r
    if (f.kind is int and r.low == 1 and not r.low_open) or (r.low == 0 and r.low_open):
        return Range(0, r.high, False, r.high_open)
    raise ValueError(f"{f.name}: 0 (unset) is not next to its range")


def _applicability(algorithms: frozenset[Algorithm]) -> dict[str, Any]:
    """Fields only for ``algorithms`` stay unset unless the job names one of them (no default algorithm is one)."""
    only = [f for f in FIELDS if f.algorithms == algorithms]
    named = {"properties": {"algorithm": {"enum": [a.value for a in Algorithm if a in algorithms]}}}
    return {
        "if": {"not": {**named, "required": ["algorithm"]}},
        "then": {"properties": {f.name: {"const": f.zero} for f in only}},
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a ``job.yaml`` file (what ``Job.from_dict`` accepts)."""
    properties: dict[str, Any] = {}
    for f in FIELDS:
        prop: dict[str, Any] = {
            "type": [JSON_TYPES[f.kind], "null"] if f.optional else JSON_TYPES[f.kind],
            "description": f"{f.help}. Default: {f.default_text()}.",
        }
        if f.sdk_default is not REQUIRED:
            prop["default"] = f.sdk_default
        if f.choices is not None:
            prop["enum"] = ([""] if f.sdk_unset_ok else []) + [c.value for c in f.choices]
        r = _sdk_range(f)
        if r is not None and r.low is not None:
            prop["exclusiveMinimum" if r.low_open else "minimum"] = r.low
        if r is not None and r.high is not None:
            prop["exclusiveMaximum" if r.high_open else "maximum"] = r.high
        if f.prefixes:
            pattern = "|".join(p.replace(".", r"\.") for p in f.prefixes)
            prop["pattern"] = f"^({pattern})" + ("|^$" if f.sdk_unset_ok else "")
        if f.max_length is not None:
            prop.update(minLength=1, maxLength=f.max_length)
        if f.pattern is not None:
            prop.update(
                items={"type": "string", "pattern": f"^(?:{f.pattern.pattern})$"},
                maxItems=f.max_items,
                uniqueItems=True,
            )
            prop["default"] = list(f.sdk_default)
        properties[f.name] = prop
    properties["request_id"] = {
        "type": "string",
        "pattern": f"^{REQUEST_ID.pattern}$",
        "description": "makes a submission idempotent; keep it to retry safely. Default: a fresh random id.",
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Cantata job",
        "description": "A job.yaml file for `cantata jobs submit`. Generated by `python -m cantata.proto.jobfields`.",
        "type": "object",
        "required": [f.name for f in FIELDS if f.sdk_default is REQUIRED],
        "additionalProperties": False,
        "properties": properties,
        "allOf": [
            _applicability(group) for group in {f.algorithms: None for f in FIELDS} if group != frozenset(Algorithm)
        ],
    }


def markdown() -> str:
    """The reference table of job fields for the docs."""
    lines = [
        "# Job fields",
        "",
        "<!-- Generated by `python -m cantata.proto.jobfields --write docs`; do not edit. -->",
        "",
        "Every field of a job, as the SDK `Job`, a `job.yaml` file (schema: `job.schema.json`) and",
        "`cantata jobs submit --FIELD` take it. A field left out (or 0 / empty) takes its default;",
        "the server fills defaults in, so a stored job shows what actually ran. Optional fields",
        "(marked *optional*) tell an explicit 0 from unset.",
        "",
        "| field | type | default | allowed | applies to | description |",
        "|---|---|---|---|---|---|",
    ]
    for f in FIELDS:
        kind = KIND_NAMES[f.kind] + (" *optional*" if f.optional else "")
        cells = (f"`{f.name}`", kind, f.default_text(), f.allowed_text(), f.applies_text(), f.help)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "`request_id` (SDK and YAML only): " + str(json_schema()["properties"]["request_id"]["description"])]
    return "\n".join(lines) + "\n"


def documents() -> dict[str, str]:
    """Generated file name -> content."""
    return {"job.schema.json": json.dumps(json_schema(), indent=2) + "\n", "job-fields.md": markdown()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write or check the generated job-field documents")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="DIR", help="write them into DIR")
    mode.add_argument("--check", type=Path, metavar="DIR", help="exit 1 if those in DIR are stale")
    args = parser.parse_args(argv)
    if args.write:
        args.write.mkdir(parents=True, exist_ok=True)
        for name, text in documents().items():
            (args.write / name).write_text(text)
        return 0
    stale = [name for name, text in documents().items() if not _same(args.check / name, text)]
    if stale:
        print(f"stale: {', '.join(stale)}; run python -m cantata.proto.jobfields --write {args.check}", file=sys.stderr)
        return 1
    return 0


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text() == text


if __name__ == "__main__":
    sys.exit(main())
