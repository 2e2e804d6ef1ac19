"""Server-side parsing of a tenant's ``JobSpec``: defaults, limits, paths.

The SDK validates too, but only this check is authoritative. A bad field is an
``InvalidField`` naming it. ``file://`` locations must lie under an allowed
root, with no ``..`` and no symbolic link on the way; ``s3://`` and ``az://``
stores are reached with the server's own SDK configuration.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from cantata.proto.v1 import common_pb2

MODELS = ("gpt-tiny", "gpt-small")
ALGORITHMS = ("single", "allreduce", "gasloc", "diloco")
DECENTRALIZED = ("gasloc", "diloco")
OPTIMIZERS = ("adamw", "muon")
TOPOLOGIES = ("ring", "torus", "exponential", "complete", "one-peer", "two-peer")
COMPRESSIONS = ("none", "bf16", "int8")
UTF8_POLICIES = ("", "skip", "fail")
MAX_NAME = 128
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
MAX_STEPS = 10_000_000
MAX_WORKERS = 256
MAX_RANKS_PER_WORKER = 64
OUTER_FIELDS = ("outer_lr", "outer_momentum", "gossip_step")  # optional: an explicit 0 is not "unset"
DECENTRALIZED_DEFAULTS = {  # algorithm -> (local steps H, outer lr eta, outer momentum gamma, topology)
    "diloco": (20, 0.7, 0.9, "complete"),
    "gasloc": (20, 1.0, 0.5, "ring"),
}


class InvalidField(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise InvalidField(field, message)


def local_path(uri: str, field: str, roots: list[Path]) -> Path:
    """The directory a ``file://`` URI names, if it is safely inside one of ``roots``."""
    parsed = urlparse(uri)
    _require(parsed.scheme == "file" and parsed.netloc in ("", "localhost"), field, f"not a file:// URI: {uri!r}")
    raw = unquote(parsed.path)
    _require(raw.startswith("/"), field, "file:// paths must be absolute")
    _require(".." not in Path(raw).parts, field, "'..' is not allowed in paths")
    path = Path(os.path.abspath(raw))
    # Walk up to the nearest existing ancestor: any link on the way is refused.
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    _require(os.path.realpath(probe) == str(probe), field, "paths through symbolic links are not allowed")
    _require(any(path == root or root in path.parents for root in roots), field, f"{path} is outside the allowed roots")
    return path


def processes(spec: common_pb2.JobSpec) -> int:
    """Worker processes a parsed job runs: ``workers`` groups of ``ranks_per_worker`` ranks."""
    return spec.workers * spec.ranks_per_worker


def parse_job_spec(spec: common_pb2.JobSpec, *, default_store: str, roots: list[Path]) -> common_pb2.JobSpec:
    """Return a copy of ``spec`` with defaults filled in, or raise ``InvalidField``."""
    s = common_pb2.JobSpec()
    s.CopyFrom(spec)
    _require(
        0 < len(s.name) <= MAX_NAME and s.name.isprintable(), "name", f"1-{MAX_NAME} printable characters required"
    )
    s.model = s.model or "gpt-tiny"
    _require(s.model in MODELS, "model", f"unknown model {s.model!r} (known: {', '.join(MODELS)})")
    s.dataset = s.dataset or "builtin:pystdlib"
    check_dataset(s.dataset, roots)
    s.algorithm = s.algorithm or ("allreduce" if s.workers > 1 else "single")
    _require(s.algorithm in ALGORITHMS, "algorithm", f"unknown algorithm {s.algorithm!r}")
    s.workers = s.workers or 1
    _require(0 < s.workers <= MAX_WORKERS, "workers", f"must be 1..{MAX_WORKERS}")
    _require(s.algorithm != "single" or s.workers == 1, "workers", "algorithm 'single' runs one worker")
    _require(0 <= s.ranks_per_worker <= MAX_RANKS_PER_WORKER, "ranks_per_worker", f"must be 1..{MAX_RANKS_PER_WORKER}")
    s.ranks_per_worker = s.ranks_per_worker or 1
    _require(processes(s) <= MAX_WORKERS, "ranks_per_worker", f"workers x ranks_per_worker must be <= {MAX_WORKERS}")
    if s.algorithm in DECENTRALIZED:
        _parse_decentralized(s)
    else:
        for name in ("topology", "local_steps", "compression", "min_workers"):
            _require(not getattr(s, name), name, "only for gasloc or diloco")
        for name in OUTER_FIELDS:
            _require(not s.HasField(name), name, "only for gasloc or diloco")
        _require(
            s.ranks_per_worker == 1,
            "ranks_per_worker",
            "worker groups are for gasloc or diloco (allreduce already spreads one model over its workers)",
        )
    _require(s.on_bad_utf8 in UTF8_POLICIES, "on_bad_utf8", f"one of {', '.join(UTF8_POLICIES[1:])}")
    s.optimizer = s.optimizer or "adamw"
    _require(s.optimizer in OPTIMIZERS, "optimizer", f"unknown optimizer {s.optimizer!r}")
    _require(0 < s.steps <= MAX_STEPS, "steps", f"must be 1..{MAX_STEPS}")
    _require(s.checkpoint_every >= 0, "checkpoint_every", "must be >= 0")
    s.checkpoint_every = s.checkpoint_every or min(100, s.steps)
    _require(s.eval_every >= 0, "eval_every", "must be >= 0")
    s.eval_every = s.eval_every or min(100, s.steps)
    _require(s.batch_size >= 0 and s.seq_len >= 0, "batch_size", "must be >= 0")
    s.batch_size = s.batch_size or 16
    s.seq_len = s.seq_len or 64
    _require(s.batch_size <= 4096, "batch_size", "must be <= 4096")
    _require(s.seq_len <= 1024, "seq_len", "must be <= 1024")
    _require(math.isfinite(s.lr) and s.lr >= 0, "lr", "must be a finite, non-negative number")
    s.lr = s.lr or (0.02 if s.optimizer == "muon" else 3e-3)
    s.seed = s.seed or 1337
    s.checkpoint_store = s.checkpoint_store or default_store
    check_store(s.checkpoint_store, "checkpoint_store", roots)
    return s


def _parse_decentralized(s: common_pb2.JobSpec) -> None:
    """Fill in and check the gasloc/diloco fields; diloco is the complete graph with alpha = 1/n."""
    local_steps, outer_lr, outer_momentum, topology = DECENTRALIZED_DEFAULTS[s.algorithm]
    _require(s.workers >= 2, "workers", f"{s.algorithm} needs at least 2 workers")
    _require(0 <= s.local_steps <= 10_000, "local_steps", "must be 0..10000 (0: the default)")
    s.local_steps = s.local_steps or local_steps
    if s.algorithm == "diloco":
        _require(s.topology in ("", "complete"), "topology", "diloco always averages over the complete graph")
        _require(not s.HasField("gossip_step"), "gossip_step", "diloco mixes with alpha = 1/workers")
    _require(
        not s.topology or s.topology in TOPOLOGIES,
        "topology",
        f"topology {s.topology!r}: one of {', '.join(TOPOLOGIES)}",
    )
    s.topology = s.topology or topology
    _require(
        not s.compression or s.compression in COMPRESSIONS,
        "compression",
        f"compression {s.compression!r}: one of {', '.join(COMPRESSIONS)}",
    )
    s.compression = s.compression or "none"
    if not s.HasField("outer_lr"):
        s.outer_lr = outer_lr
    _require(math.isfinite(s.outer_lr) and 0 < s.outer_lr <= 10, "outer_lr", "must be a number in (0, 10]")
    if not s.HasField("outer_momentum"):
        s.outer_momentum = outer_momentum
    _require(
        math.isfinite(s.outer_momentum) and 0 <= s.outer_momentum < 1, "outer_momentum", "must be a number in [0, 1)"
    )
    _require(
        not s.HasField("gossip_step") or (math.isfinite(s.gossip_step) and 0 < s.gossip_step <= 1),
        "gossip_step",
        "must be a number in (0, 1]",
    )
    _require(0 <= s.min_workers <= s.workers, "min_workers", f"must be 1..{s.workers} (0: a majority)")
    s.min_workers = s.min_workers or s.workers // 2 + 1


def dataset_source(dataset: str) -> str:
    """The data source an ``s3://SOURCE@bucket/prefix`` or ``az://SOURCE@container/prefix`` dataset names."""
    scheme, _, rest = dataset.partition("://")
    if scheme not in ("s3", "az"):
        return ""
    return unquote(rest.partition("/")[0].rpartition("@")[0])


def check_dataset(dataset: str, roots: list[Path]) -> None:
    """``builtin:pystdlib``, a ``file://`` directory under the roots, or a store prefix read through a data source.

    A store dataset must name one of the tenant's data sources: the server's
    own credentials (those of its checkpoint stores) never read tenant data.
    """
    if dataset == "builtin:pystdlib":
        return
    if dataset.startswith("file://"):
        local_path(dataset, "dataset", roots)
        return
    scheme, _, rest = dataset.partition("://")
    _require(
        scheme in ("s3", "az"),
        "dataset",
        f"unknown dataset {dataset!r} (use builtin:pystdlib, file://, s3://SOURCE@bucket/prefix or "
        "az://SOURCE@container/prefix)",
    )
    _require(
        bool(dataset_source(dataset)),
        "dataset",
        f"{dataset!r} names no data source: register one and write {scheme}://SOURCE@{rest}",
    )
    check_store(f"{scheme}://{rest.partition('@')[2]}", "dataset", roots)


def check_store(uri: str, field: str, roots: list[Path]) -> None:
    """A blob store URI the platform can use: file:// under the roots, s3://bucket/prefix, az://container/prefix."""
    scheme, _, rest = uri.partition("://")
    if scheme == "file":
        local_path(uri, field, roots)
        return
    _require(scheme in ("s3", "az"), field, f"unsupported store {uri!r} (use file://, s3:// or az://)")
    bucket, _, prefix = rest.partition("/")
    _require(BUCKET.match(bucket) is not None, field, f"invalid bucket or container name {bucket!r}")
    _require(".." not in prefix.split("/") and len(prefix) <= 512, field, "invalid prefix")
