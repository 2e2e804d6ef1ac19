"""The rules of a job spec that tie its fields together, shared by the SDK, the CLI and the server.

:mod:`cantata.proto.jobfields` checks each field alone; :func:`checked` adds
what depends on several (``single`` runs one worker, diloco's fixed graph,
the process limit, the mesh, the tokenizer, float8) and fills the defaults in.
``Job.validate()`` and the server's ``parse_job_spec`` both call it, so a spec
the SDK accepts is refused by the server only for what the SDK cannot know:
the tenant's ``file://`` roots, its data sources, the store prefixes and a
node's memory (:mod:`cantata.server.jobs.jobspec`). :func:`check_sources` is the
part of the location checks both run: a store location names a data source.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import unquote

from cantata.proto import jobfields
from cantata.proto.jobfields import MAX_WORKERS, JobField
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import (
    BYTE_GPTS,
    DECENTRALIZED,
    MODEL_SHAPES,
    Algorithm,
    Compression,
    Model,
    Optimizer,
    PipelineSchedule,
    Topology,
)
from cantata.storage import uri as stores

TOKENIZER = re.compile(r"sha256:[0-9a-f]{64}")
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class InvalidField(ValueError):
    """A field of a job spec is refused; ``str()`` is ``"FIELD: why"``."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise InvalidField(field, message)


def processes(spec: common_pb2.JobSpec) -> int:
    """Worker processes a checked job runs: ``workers`` groups of ``ranks_per_worker`` ranks."""
    return spec.workers * spec.ranks_per_worker


def checked(
    spec: common_pb2.JobSpec, unset_ok: Callable[[JobField], bool] = lambda f: not f.required
) -> common_pb2.JobSpec:
    """A copy of ``spec`` with the server's defaults filled in, or ``InvalidField`` naming the first bad field.

    ``unset_ok`` says which fields may stay unset for the table's check (the server: all but the required).
    """
    s = common_pb2.JobSpec()
    s.CopyFrom(spec)
    for field, message in jobfields.problems(s, unset_ok):
        raise InvalidField(field, message)
    if s.algorithm == Algorithm.DILOCO:  # before the defaults: diloco's graph and mixing step are fixed
        require(s.topology in ("", Topology.COMPLETE), "topology", "diloco always averages over the complete graph")
        require(not s.HasField("gossip_step"), "gossip_step", "diloco mixes with alpha = 1/workers")
        require(
            s.compression != Compression.INT8,
            "compression",
            "diloco's ring all-reduce adds partial sums on the way, which int8 codes cannot carry (use bf16)",
        )
    if s.optimizer != Optimizer.MUON:  # before the defaults, which fill these in for muon only
        for f in jobfields.MUON_FIELDS:
            require(not jobfields.is_set(f, jobfields.value_of(s, f)), f.name, "only with optimizer 'muon'")
    if not s.HasField("spike_zscore"):  # before the defaults, which fill spike_window in with it
        require(not s.HasField("spike_window"), "spike_window", "only with spike_zscore")
    jobfields.fill_defaults(s)
    require(s.algorithm != Algorithm.SINGLE or s.workers == 1, "workers", "algorithm 'single' runs one worker")
    require(s.warmup_steps <= s.steps, "warmup_steps", f"must be at most steps ({s.steps})")
    require(processes(s) <= MAX_WORKERS, "ranks_per_worker", f"workers x ranks_per_worker must be <= {MAX_WORKERS}")
    if s.algorithm in DECENTRALIZED:
        require(s.workers >= 2, "workers", f"{s.algorithm} needs at least 2 workers")
        require(s.min_workers <= s.workers, "min_workers", f"must be 1..{s.workers} (0: a majority)")
    else:
        require(
            s.ranks_per_worker == 1,
            "ranks_per_worker",
            "worker groups are for gasloc or diloco (allreduce already spreads one model over its workers)",
        )
    check_vocabulary(s)
    check_pipeline(s)
    check_mesh(s)
    check_float8(s)
    return s


def check_pipeline(s: common_pb2.JobSpec) -> None:
    """A pipeline (``pp`` > 1) splits an untied decoder's layers into stages, each sharded over ``dp_shard`` and ``tp`` ranks.

    The stages share out the decoder's layers with the embedding and the head
    counted as one layer each, so there are at most that many stages; each
    batch splits into ``pp_microbatches`` equal micro-batches.
    """
    if s.pp <= 1:
        require(not s.pp_microbatches, "pp_microbatches", "only with pp > 1")
        return
    model = Model(s.model)
    shape = MODEL_SHAPES[model]
    require(model not in BYTE_GPTS, "pp", f"{s.model} is not split into stages: use a decoder (llama-*, qwen3-*)")
    require(
        not shape["tie_embeddings"],
        "pp",
        f"{s.model} ties its output head to its embedding, which the first and last stages would both hold: "
        "use an untied decoder (llama-*, qwen3-8b and larger)",
    )
    require(
        s.dp_replicate == 1,
        "pp",
        "pipeline parallelism composes with dp_shard and tp, not yet with dp_replicate (HSDP): give it 1",
    )
    stages, units = jobfields.pipeline_stages(s), int(shape["n_layers"]) + 2
    require(
        stages <= units,
        "pp",
        f"{s.pp_schedule} over pp = {s.pp} makes {stages} stages, more than {s.model}'s {units - 2} layers "
        "plus its embedding and head",
    )
    require(
        s.batch_size % s.pp_microbatches == 0,
        "pp_microbatches",
        f"must divide batch_size ({s.batch_size}), not {s.pp_microbatches}",
    )
    per_round = s.pp if s.pp_schedule == PipelineSchedule.INTERLEAVED_1F1B else 1
    require(
        s.pp_microbatches >= s.pp and s.pp_microbatches % per_round == 0,
        "pp_microbatches",
        f"{s.pp_schedule} needs at least pp ({s.pp}) micro-batches"
        + (", a multiple of pp" if per_round > 1 else "")
        + f", not {s.pp_microbatches}",
    )
    require(s.grad_accum == 1, "grad_accum", "a pipeline's micro-batches (pp_microbatches) take grad_accum's place")
    require(s.optimizer != Optimizer.MUON, "optimizer", "muon on a pipeline is not supported yet: use adamw")
    require(not s.compile, "compile", "regional compilation of a pipeline's stages is not supported yet")
    require(not s.init_from, "init_from", "initial weights for a pipeline's stages are not supported yet")
    require(not s.float8, "float8", "a pipeline trains on the CPU for now: float8 needs a single-GPU job")


def check_mesh(s: common_pb2.JobSpec) -> None:
    """A mesh covers the job's workers (a decentralized job's worker group) exactly, shards a decoder,
    and splits its key/value heads evenly."""
    if s.algorithm in DECENTRALIZED:
        if s.dp_shard == 1:
            return
        require(
            s.dp_shard == s.ranks_per_worker,
            "dp_shard",
            f"a {s.algorithm} job shards each worker group over its ranks: dp_shard must equal ranks_per_worker "
            f"({s.ranks_per_worker}), not {s.dp_shard}",
        )
    else:
        mesh = s.dp_replicate * s.dp_shard * s.tp * (s.pp or 1)
        if mesh == 1:
            return
        require(
            mesh == s.workers,
            "workers",
            f"dp_replicate x dp_shard x tp x pp = {mesh} ranks, so the job needs workers = {mesh}, not {s.workers}",
        )
    shape = MODEL_SHAPES[Model(s.model)]
    require(Model(s.model) not in BYTE_GPTS, "model", f"{s.model} is not sharded: use a decoder (llama-*, qwen3-*)")
    tp = s.tp or 1  # a decentralized job has no tensor parallelism
    require(int(shape["n_kv_heads"]) % tp == 0, "tp", f"must divide {s.model}'s {shape['n_kv_heads']} key/value heads")
    require(
        s.optimizer != Optimizer.MUON or s.algorithm not in DECENTRALIZED,
        "optimizer",
        "muon on a sharded worker group is not supported yet (Canzona runs on allreduce meshes): use adamw",
    )


def check_float8(s: common_pb2.JobSpec) -> None:
    """float8 matmuls run on GPUs only: a job whose workers would train on the CPU is refused."""
    if not s.float8:
        return
    require(s.gpus_per_worker > 0, "float8", "float8 trains on GPUs, and gpus_per_worker 0 trains on the CPU")
    require(
        s.algorithm not in DECENTRALIZED,
        "float8",
        f"{s.algorithm} workers train on the CPU (their gossip and outer step run there): float8 needs a GPU",
    )
    require(
        s.dp_replicate * s.dp_shard * s.tp == 1,
        "float8",
        "a mesh job (dp_shard, tp, dp_replicate) trains on the CPU for now: float8 needs a single-GPU or "
        "data-parallel job",
    )


def check_vocabulary(s: common_pb2.JobSpec) -> None:
    """A named tokenizer comes with its vocabulary size, which must fit the model's (a builtin dataset is bytes)."""
    vocab = int(MODEL_SHAPES[Model(s.model)]["vocab_size"])
    if s.tokenizer:
        require(
            TOKENIZER.fullmatch(s.tokenizer) is not None,
            "tokenizer",
            "must be sha256: and 64 lower-case hex digits, as cantata data prepare --tokenizer prints it",
        )
        require(s.tokenizer_vocab > 0, "tokenizer_vocab", "give the tokenizer's vocabulary size with tokenizer")
        require(not s.dataset.startswith("builtin:"), "tokenizer", f"{s.dataset} is byte-level text, not tokenized")
    require(
        s.tokenizer_vocab <= vocab,
        "tokenizer_vocab",
        f"{s.tokenizer_vocab} tokens do not fit model {s.model}, whose vocabulary is {vocab}",
    )


def dataset_source(uri: str) -> str:
    """The data source an ``s3://SOURCE@bucket/prefix`` or ``az://SOURCE@container/prefix`` location names ("" if none)."""
    scheme, _, rest = uri.partition("://")
    if not stores.is_remote(scheme):
        return ""
    return unquote(rest.partition("/")[0].rpartition("@")[0])


def check_source(uri: str, field: str) -> str:
    """A location read through a data source (``dataset``, ``init_from``): return its store URI, the source left out.

    A store location must name one of the tenant's data sources: the server's
    own credentials (those of its checkpoint stores) never read tenant data.
    """
    scheme, _, rest = uri.partition("://")
    require(
        stores.is_remote(scheme),
        field,
        f"unknown {field} {uri!r} (use {'builtin:pystdlib, ' if field == 'dataset' else ''}file://, "
        "s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix)",
    )
    require(
        bool(dataset_source(uri)),
        field,
        f"{uri!r} names no data source: register one and write {scheme}://SOURCE@{rest}",
    )
    store = rest.partition("@")[2]
    bucket = store.partition("/")[0]
    require(BUCKET.fullmatch(bucket) is not None, field, f"invalid bucket or container name {bucket!r}")
    return f"{scheme}://{store}"


def check_sources(s: common_pb2.JobSpec) -> None:
    """Each location of ``s`` that is neither builtin nor ``file://`` names a data source and a valid bucket."""
    for field, uri in (("dataset", s.dataset), ("init_from", s.init_from)):
        if uri and uri != "builtin:pystdlib" and not stores.is_local(uri):
            check_source(uri, field)
