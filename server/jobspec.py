"""Server-side parsing of a tenant's ``JobSpec``: defaults, limits, paths.

The SDK validates too, but only this check is authoritative. A bad field is an
``InvalidField`` naming it. Defaults, ranges, choices and which algorithms a
field applies to come from the job-field table (:mod:`cantata.proto.jobfields`);
the rules that tie fields together are written out here. ``file://``
locations must lie under an allowed root, with no ``..`` and no symbolic link
on the way; ``s3://`` and ``az://`` stores are reached with the server's own
SDK configuration.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from cantata.proto import jobfields
from cantata.proto.jobfields import MAX_WORKERS
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import DECENTRALIZED, Algorithm, Compression, Topology

BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


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
    jobfields.fill_defaults(s)
    s.checkpoint_store = s.checkpoint_store or default_store
    _require(s.algorithm != Algorithm.SINGLE or s.workers == 1, "workers", "algorithm 'single' runs one worker")
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
    check_dataset(s.dataset, roots)
    check_store(s.checkpoint_store, "checkpoint_store", roots)
    return s


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
