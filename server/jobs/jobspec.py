"""Server-side parsing of a tenant's ``JobSpec``: defaults, limits, paths.

The SDK validates too, but only this check is authoritative. A bad field is an
``InvalidField`` naming it. Defaults, ranges, choices and which algorithms a
field applies to come from the job-field table (:mod:`cantata.proto.jobfields`),
the rules that tie fields together from :mod:`cantata.proto.jobrules`, which the
SDK runs too; what only the server knows is checked here. ``file://``
locations must lie under one of the tenant's roots (:mod:`cantata.server.workers.local_roots`),
never in the platform's data directory, with no ``..`` and no symbolic link on
the way; a location outside them is refused with one message whether it exists
or not. ``s3://`` and ``az://`` stores are reached with the server's own SDK
configuration. A job that would not fit in a node's memory (:mod:`cantata.server.jobs.memory`: on one
machine all its ranks together, on a cluster each rank) is refused naming the cause and the changes that
would fit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from cantata.proto.jobrules import BUCKET, InvalidField, check_mesh, check_source, checked, dataset_source, processes
from cantata.proto.jobrules import require as _require
from cantata.proto.v1 import common_pb2
from cantata.proto.vocabulary import DECENTRALIZED, Algorithm
from cantata.server.jobs import memory
from cantata.server.workers.local_roots import within
from cantata.storage import uri as stores
from cantata.storage.base import StoreConfigError, store_prefix

__all__ = [
    "BUCKET",
    "DECENTRALIZED",
    "InvalidField",
    "check_mesh",
    "dataset_source",
    "parse_job_spec",
    "processes",
    "resumed_spec",
]


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
    s = checked(spec)
    s.checkpoint_store = s.checkpoint_store or default_store
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
    _require(
        resumed.pp == s.pp,
        "pp",
        f"a pipeline-parallel job resumes on its own pp degree ({s.pp}, not {resumed.pp}): each rank's checkpoint "
        "holds its stages' layers and optimizer state, which are not resharded",
    )
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

    A store location must name one of the tenant's data sources (:func:`cantata.proto.jobrules.check_source`).
    """
    if stores.is_local(uri):
        local_path(uri, field, roots, data_dir=data_dir, own_folders=own_folders)
        return
    check_store(check_source(uri, field), field, roots)


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
