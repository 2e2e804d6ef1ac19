"""Server-side parsing of a tenant's ``JobSpec``: defaults, limits, paths.

The SDK validates too, but only this check is authoritative. A bad field is an
``InvalidField`` naming it. Defaults, ranges, choices and which algorithms a
field applies to come from the job-field table (:mod:`cantata.proto.jobfields`);
the rules that tie fields together are written out here. ``file://``
locations must lie under one of the tenant's roots (:mod:`cantata.server.local_roots`),
never in the platform's data directory, with no ``..`` and no symbolic link on
the way; a location outside them is refused with one message whether it exists
or not. ``s3://`` and ``az://`` stores are reached with the server's own SDK
configuration. A job that would not fit in a node's memory (:mod:`cantata.server.memory`: on one
machine all its ranks together, on a cluster each rank) is refused naming the cause and the changes that
would fit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from cantata.proto import jobfields
from cantata.proto.jobfields import MAX_WORKERS
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import (
    BYTE_GPTS,
    DECENTRALIZED,
    MODEL_SHAPES,
    Algorithm,
    Compression,
    Model,
    Optimizer,
    Topology,
)
from cantata.server import memory
from cantata.server.local_roots import within
from cantata.storage import uri as stores
from cantata.storage.base import StoreConfigError, store_prefix

BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class InvalidField(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise InvalidField(field, message)


def local_path(
    uri: str,
    field: str,
    roots: list[Path],
    *,
    data_dir: Path | None = None,
    store_dir: Path | None = None,
    own_folders: Sequence[Path] = (),
) -> Path:
    """The directory a ``file://`` URI names, if it is safely inside one of ``roots``.

    Nothing in ``data_dir`` is, but in a root inside ``store_dir`` (the default checkpoint store,
    for checkpoint stores: a tenant's own folder of it). ``own_folders`` are the tenant's folders
    of the shared roots (``<root>/<tenant>``): under such a root nothing outside its own folder
    is, even through a root granted to it (the rest is other tenants'). Whether the path is
    inside is decided on its text alone, before anything on disk is looked at: a path outside
    gets the same answer whether or not it exists.
    """
    parsed = urlparse(uri)
    _require(parsed.scheme == stores.LOCAL and parsed.netloc in ("", "localhost"), field, f"not a file:// URI: {uri!r}")
    raw = unquote(parsed.path)
    _require(raw.startswith("/"), field, "file:// paths must be absolute")
    _require(".." not in Path(raw).parts, field, "'..' is not allowed in paths")
    path = Path(os.path.abspath(raw))
    _require(
        any(
            within(path, root)
            and (data_dir is None or not within(path, data_dir) or (store_dir is not None and within(root, store_dir)))
            for root in roots
        ),
        field,
        f"{path} is outside the allowed roots (yours: <root>/<tenant>/...)",
    )
    for own in own_folders:
        _require(
            within(path, own) or not within(path, own.parent),
            field,
            f"{path} is in the shared root {own.parent} outside your folder of it ({own}): the rest is other tenants'",
        )
    # Walk up to the nearest existing ancestor: any link on the way is refused.
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    _require(os.path.realpath(probe) == str(probe), field, "paths through symbolic links are not allowed")
    return path


def processes(spec: common_pb2.JobSpec) -> int:
    """Worker processes a parsed job runs: ``workers`` groups of ``ranks_per_worker`` ranks."""
    return spec.workers * spec.ranks_per_worker


def parse_job_spec(
    spec: common_pb2.JobSpec,
    *,
    default_store: str,
    roots: list[Path],
    store_roots: list[Path] | None = None,
    data_dir: Path | None = None,
    node_memory: int = 0,
    shared_roots: list[Path] | None = None,
    own_folders: Sequence[Path] = (),
) -> common_pb2.JobSpec:
    """Return a copy of ``spec`` with defaults filled in, or raise ``InvalidField``.

    ``roots`` hold the tenant's ``file://`` datasets, ``store_roots`` (default: ``roots``) its
    ``file://`` checkpoint stores besides ``default_store``; nothing in ``data_dir`` is either. A
    job whose ranks need more than ``node_memory`` bytes (0: unchecked; all of them together on one machine,
    each on a cluster) is refused.
    ``shared_roots`` (on a cluster; None: one machine) are the ``file://`` roots every node mounts:
    a job of more than one worker process may span nodes, so its ``file://`` store must lie under one.
    ``own_folders`` are the tenant's folders of the ``allowed_roots`` (see :func:`local_path`).
    """
    s = common_pb2.JobSpec()
    s.CopyFrom(spec)
    for field, message in jobfields.problems(s, lambda f: not f.required):
        raise InvalidField(field, message)
    if s.algorithm == Algorithm.DILOCO:  # before the defaults: diloco's graph and mixing step are fixed
        _require(s.topology in ("", Topology.COMPLETE), "topology", "diloco always averages over the complete graph")
        _require(not s.HasField("gossip_step"), "gossip_step", "diloco mixes with alpha = 1/workers")
        _require(
            s.compression != Compression.INT8,
            "compression",
            "diloco's ring all-reduce adds partial sums on the way, which int8 codes cannot carry (use bf16)",
        )
    if s.optimizer != Optimizer.MUON:  # before the defaults, which fill these in for muon only
        for f in jobfields.MUON_FIELDS:
            _require(not jobfields.is_set(f, jobfields.value_of(s, f)), f.name, "only with optimizer 'muon'")
    if not s.HasField("spike_zscore"):  # before the defaults, which fill spike_window in with it
        _require(not s.HasField("spike_window"), "spike_window", "only with spike_zscore")
    jobfields.fill_defaults(s)
    s.checkpoint_store = s.checkpoint_store or default_store
    _require(s.algorithm != Algorithm.SINGLE or s.workers == 1, "workers", "algorithm 'single' runs one worker")
    _require(s.warmup_steps <= s.steps, "warmup_steps", f"must be at most steps ({s.steps})")
    _require(processes(s) <= MAX_WORKERS, "ranks_per_worker", f"workers x ranks_per_worker must be <= {MAX_WORKERS}")
    if s.algorithm in DECENTRALIZED:
        _require(s.workers >= 2, "workers", f"{s.algorithm} needs at least 2 workers")
        _require(s.min_workers <= s.workers, "min_workers", f"must be 1..{s.workers} (0: a majority)")
    else:
        _require(
            s.ranks_per_worker == 1,
            "ranks_per_worker",
            "worker groups are for gasloc or diloco (allreduce already spreads one model over its workers)",
        )
    check_vocabulary(s)
    check_mesh(s)
    check_float8(s)
    check_dataset(s.dataset, roots, data_dir=data_dir, own_folders=own_folders)
    if s.init_from:
        check_source_location(s.init_from, "init_from", roots, data_dir=data_dir, own_folders=own_folders)
    if s.checkpoint_store != default_store:
        default_dir = stores.local_directory(default_store)
        check_store(
            s.checkpoint_store,
            "checkpoint_store",
            roots if store_roots is None else store_roots,
            data_dir=data_dir,
            store_dir=default_dir,
            own_folders=own_folders,
        )
    if shared_roots is not None and processes(s) > 1 and stores.is_local(s.checkpoint_store):
        path = Path(os.path.abspath(unquote(urlparse(s.checkpoint_store).path)))
        _require(
            any(within(path, root) for root in shared_roots),
            "checkpoint_store",
            f"the job's {processes(s)} worker processes may run on different nodes of the cluster, and a file:// "
            "store outside the shared roots is on one node only: use s3://, az:// or a file:// root every "
            "node mounts (shared_roots in server.json)",
        )
    if node_memory:
        refused = memory.refusal(s, node_memory, one_node=shared_roots is None)
        if refused is not None:
            raise InvalidField(*refused)
    return s


def check_mesh(s: common_pb2.JobSpec) -> None:
    """A mesh covers the job's workers (a decentralized job's worker group) exactly, shards a decoder,
    and splits its key/value heads evenly."""
    if s.algorithm in DECENTRALIZED:
        if s.dp_shard == 1:
            return
        _require(
            s.dp_shard == s.ranks_per_worker,
            "dp_shard",
            f"a {s.algorithm} job shards each worker group over its ranks: dp_shard must equal ranks_per_worker "
            f"({s.ranks_per_worker}), not {s.dp_shard}",
        )
    else:
        mesh = s.dp_replicate * s.dp_shard * s.tp
        if mesh == 1:
            return
        _require(
            mesh == s.workers,
            "workers",
            f"dp_replicate x dp_shard x tp = {mesh} ranks, so the job needs workers = {mesh}, not {s.workers}",
        )
    shape = MODEL_SHAPES[Model(s.model)]
    _require(Model(s.model) not in BYTE_GPTS, "model", f"{s.model} is not sharded: use a decoder (llama-*, qwen3-*)")
    tp = s.tp or 1  # a decentralized job has no tensor parallelism
    _require(int(shape["n_kv_heads"]) % tp == 0, "tp", f"must divide {s.model}'s {shape['n_kv_heads']} key/value heads")
    _require(
        s.optimizer != Optimizer.MUON or s.algorithm not in DECENTRALIZED,
        "optimizer",
        "muon on a sharded worker group is not supported yet (Canzona runs on allreduce meshes): use adamw",
    )


def check_float8(s: common_pb2.JobSpec) -> None:
    """float8 matmuls run on GPUs only: a job whose workers would train on the CPU is refused."""
    if not s.float8:
        return
    _require(s.gpus_per_worker > 0, "float8", "float8 trains on GPUs, and gpus_per_worker 0 trains on the CPU")
    _require(
        s.algorithm not in DECENTRALIZED,
        "float8",
        f"{s.algorithm} workers train on the CPU (their gossip and outer step run there): float8 needs a GPU",
    )
    _require(
        s.dp_replicate * s.dp_shard * s.tp == 1,
        "float8",
        "a mesh job (dp_shard, tp, dp_replicate) trains on the CPU for now: float8 needs a single-GPU or "
        "data-parallel job",
    )


MESH_FIELDS = ("dp_replicate", "dp_shard", "tp")


def resumed_spec(s: common_pb2.JobSpec, changes: dict[str, int]) -> common_pb2.JobSpec:
    """The spec a job resumes with: ``changes`` (workers, mesh sizes, steps; 0 keeps a value), checked as at submit.

    A job moves to another mesh only from one mesh to another: its checkpoint is
    sharded and loads on any mesh, where a single-process or plain data-parallel
    checkpoint (each rank's own optimizer state) would not.
    """
    resumed = common_pb2.JobSpec()
    resumed.CopyFrom(s)
    for field, value in changes.items():
        _require(value >= 0, field, f"must be positive, not {value}")
        if value:
            setattr(resumed, field, value)
    _require(resumed.steps >= s.steps, "steps", f"a resumed job trains on: at least {s.steps}, not {resumed.steps}")
    moved = any(getattr(resumed, f) != getattr(s, f) for f in ("workers", *MESH_FIELDS))

    def ranks(spec: common_pb2.JobSpec) -> int:
        return (spec.dp_replicate or 1) * (spec.dp_shard or 1) * (spec.tp or 1)

    _require(
        not moved or (s.algorithm in (Algorithm.SINGLE, Algorithm.ALLREDUCE) and ranks(s) > 1 and ranks(resumed) > 1),
        "workers",
        "only a mesh job (dp_shard, tp, dp_replicate) resumes on another mesh, and only on a mesh: "
        "its checkpoint is the sharded one",
    )
    check_mesh(resumed)
    return resumed


def check_vocabulary(s: common_pb2.JobSpec) -> None:
    """A named tokenizer comes with its vocabulary size, which must fit the model's (a builtin dataset is bytes)."""
    vocab = int(MODEL_SHAPES[Model(s.model)]["vocab_size"])
    if s.tokenizer:
        _require(
            re.fullmatch(r"sha256:[0-9a-f]{64}", s.tokenizer) is not None,
            "tokenizer",
            "must be sha256: and 64 lower-case hex digits, as cantata data prepare --tokenizer prints it",
        )
        _require(s.tokenizer_vocab > 0, "tokenizer_vocab", "give the tokenizer's vocabulary size with tokenizer")
        _require(not s.dataset.startswith("builtin:"), "tokenizer", f"{s.dataset} is byte-level text, not tokenized")
    _require(
        s.tokenizer_vocab <= vocab,
        "tokenizer_vocab",
        f"{s.tokenizer_vocab} tokens do not fit model {s.model}, whose vocabulary is {vocab}",
    )


def dataset_source(dataset: str) -> str:
    """The data source an ``s3://SOURCE@bucket/prefix`` or ``az://SOURCE@container/prefix`` location names ("" if none)."""
    scheme, _, rest = dataset.partition("://")
    if not stores.is_remote(scheme):
        return ""
    return unquote(rest.partition("/")[0].rpartition("@")[0])


def job_sources(spec: common_pb2.JobSpec) -> dict[str, str]:
    """The data sources a job reads through, by field (``dataset``, ``init_from``), for those that name one."""
    named = {"dataset": dataset_source(spec.dataset), "init_from": dataset_source(spec.init_from)}
    return {field: source for field, source in named.items() if source}


def check_dataset(
    dataset: str, roots: list[Path], *, data_dir: Path | None = None, own_folders: Sequence[Path] = ()
) -> None:
    """``builtin:pystdlib``, a ``file://`` directory under the roots, or a store prefix read through a data source."""
    if dataset != "builtin:pystdlib":
        check_source_location(dataset, "dataset", roots, data_dir=data_dir, own_folders=own_folders)


def check_source_location(
    uri: str, field: str, roots: list[Path], *, data_dir: Path | None = None, own_folders: Sequence[Path] = ()
) -> None:
    """A ``file://`` path under the roots, or a store prefix read through a data source (``dataset``, ``init_from``).

    A store location must name one of the tenant's data sources: the server's
    own credentials (those of its checkpoint stores) never read tenant data.
    """
    if stores.is_local(uri):
        local_path(uri, field, roots, data_dir=data_dir, own_folders=own_folders)
        return
    scheme, _, rest = uri.partition("://")
    _require(
        stores.is_remote(scheme),
        field,
        f"unknown {field} {uri!r} (use {'builtin:pystdlib, ' if field == 'dataset' else ''}file://, "
        "s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix)",
    )
    _require(
        bool(dataset_source(uri)),
        field,
        f"{uri!r} names no data source: register one and write {scheme}://SOURCE@{rest}",
    )
    check_store(f"{scheme}://{rest.partition('@')[2]}", field, roots)


def check_store(
    uri: str,
    field: str,
    roots: list[Path],
    *,
    data_dir: Path | None = None,
    store_dir: Path | None = None,
    own_folders: Sequence[Path] = (),
) -> None:
    """A blob store URI the platform can use: file:// under the roots, s3://bucket/prefix, az://container/prefix."""
    scheme, _, rest = uri.partition("://")
    if scheme == stores.LOCAL:
        local_path(uri, field, roots, data_dir=data_dir, store_dir=store_dir, own_folders=own_folders)
        return
    _require(stores.is_remote(scheme), field, f"unsupported store {uri!r} (use file://, s3:// or az://)")
    bucket, _, prefix = rest.partition("/")
    _require(BUCKET.fullmatch(bucket) is not None, field, f"invalid bucket or container name {bucket!r}")
    _require(len(prefix) <= 512 and _valid_prefix(prefix), field, f"invalid prefix {prefix!r}")


def _valid_prefix(prefix: str) -> bool:
    """A store prefix the stores accept as they are: ``/``-separated plain names (see ``store_prefix``)."""
    try:
        store_prefix(prefix)
    except StoreConfigError:
        return False
    return True
