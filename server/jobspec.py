"""Server-side parsing of a tenant's ``JobSpec``: defaults, limits, paths.

The SDK validates too, but only this check is authoritative. A bad field is an
``InvalidField`` naming it. ``file://`` locations must lie under an allowed
root, with no ``..`` and no symbolic link on the way.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from cantata.proto.v1 import common_pb2

MODELS = ("gpt-tiny", "gpt-small")
ALGORITHMS = ("single", "allreduce")
OPTIMIZERS = ("adamw", "muon")
TOPOLOGIES = ("", "complete")
COMPRESSIONS = ("", "none")
MAX_NAME = 128
MAX_STEPS = 10_000_000
MAX_WORKERS = 256


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
    _require(any(path == root or root in path.parents for root in roots), field,
             f"{path} is outside the allowed roots")
    return path


def parse_job_spec(spec: common_pb2.JobSpec, *, default_store: str, roots: list[Path]) -> common_pb2.JobSpec:
    """Return a copy of ``spec`` with defaults filled in, or raise ``InvalidField``."""
    s = common_pb2.JobSpec()
    s.CopyFrom(spec)
    _require(0 < len(s.name) <= MAX_NAME and s.name.isprintable(), "name",
             f"1-{MAX_NAME} printable characters required")
    s.model = s.model or "gpt-tiny"
    _require(s.model in MODELS, "model", f"unknown model {s.model!r} (known: {', '.join(MODELS)})")
    s.dataset = s.dataset or "builtin:pystdlib"
    if s.dataset.startswith("file://"):
        local_path(s.dataset, "dataset", roots)
    else:
        _require(s.dataset == "builtin:pystdlib", "dataset",
                 f"unknown dataset {s.dataset!r} (use builtin:pystdlib or file://)")
    s.algorithm = s.algorithm or ("allreduce" if s.workers > 1 else "single")
    _require(s.algorithm in ALGORITHMS, "algorithm", f"unknown algorithm {s.algorithm!r}")
    s.workers = s.workers or 1
    _require(0 < s.workers <= MAX_WORKERS, "workers", f"must be 1..{MAX_WORKERS}")
    _require(s.algorithm != "single" or s.workers == 1, "workers", "algorithm 'single' runs one worker")
    _require(s.topology in TOPOLOGIES, "topology", f"unknown topology {s.topology!r}")
    _require(s.compression in COMPRESSIONS, "compression", f"unknown compression {s.compression!r}")
    s.optimizer = s.optimizer or "adamw"
    _require(s.optimizer in OPTIMIZERS, "optimizer", f"unknown optimizer {s.optimizer!r}")
    _require(0 < s.steps <= MAX_STEPS, "steps", f"must be 1..{MAX_STEPS}")
    _require(s.checkpoint_every >= 0, "checkpoint_every", "must be >= 0")
    s.checkpoint_every = s.checkpoint_every or min(100, s.steps)
    _require(s.eval_every >= 0, "eval_every", "must be >= 0")
    s.eval_every = s.eval_every or min(100, s.steps)
    _require(s.batch_size >= 0 and s.seq_len >= 0 and s.local_steps >= 0, "batch_size", "must be >= 0")
    s.batch_size = s.batch_size or 16
    s.seq_len = s.seq_len or 64
    _require(s.batch_size <= 4096, "batch_size", "must be <= 4096")
    _require(s.seq_len <= 1024, "seq_len", "must be <= 1024")
    _require(math.isfinite(s.lr) and s.lr >= 0, "lr", "must be a finite, non-negative number")
    s.lr = s.lr or (0.02 if s.optimizer == "muon" else 3e-3)
    s.seed = s.seed or 1337
    s.checkpoint_store = s.checkpoint_store or default_store
    local_path(s.checkpoint_store, "checkpoint_store", roots)
    return s
