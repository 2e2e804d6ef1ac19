"""``Job``: what a tenant asks to train, validated on the client before it is sent."""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass, field

from cantata.proto.v1 import common_pb2
from cantata.sdk.errors import InvalidJob

ALGORITHMS = ("single", "allreduce", "gasloc", "diloco")
DATASET_SCHEMES = ("builtin:", "file://", "s3://", "az://")
STORE_SCHEMES = ("file://", "s3://", "az://")


@dataclass
class Job:
    """A training job. ``request_id`` makes ``submit`` idempotent; keep it to retry safely."""

    name: str
    model: str = "gpt-tiny"
    dataset: str = "builtin:pystdlib"
    algorithm: str = ""
    workers: int = 1
    topology: str = ""
    local_steps: int = 0
    optimizer: str = "adamw"
    steps: int = 300
    checkpoint_every: int = 0
    checkpoint_store: str = ""
    eval_every: int = 0
    batch_size: int = 0
    seq_len: int = 0
    lr: float = 0.0
    seed: int = 0
    outer_lr: float | None = None  # gasloc/diloco outer step eta (None: 1.0 for gasloc, 0.7 for diloco)
    outer_momentum: float | None = None  # gamma; 0 is plain gossip (None: 0.5 for gasloc, 0.9 for diloco)
    gossip_step: float | None = None  # gasloc mixing step alpha (None: Metropolis 1/(d_max+1))
    compression: str = ""
    ranks_per_worker: int = 0  # gasloc/diloco: processes per worker group, data parallel inside (default 1)
    min_workers: int = 0  # gasloc/diloco: fail when fewer worker groups are alive (default: a majority)
    trace_samples: bool = False  # log each step's sample ids (data lineage)
    on_bad_utf8: str = ""  # "skip" (default: a warning event) or "fail"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def validate(self) -> None:
        """Raise ``InvalidJob`` naming the first bad field (the server checks again)."""

        def bad(field_name: str, why: str) -> InvalidJob:
            return InvalidJob(f"{field_name}: {why}", field=field_name)

        if not isinstance(self.name, str) or not 0 < len(self.name) <= 128:
            raise bad("name", "1-128 characters required")
        for name in ("workers", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise bad(name, "must be a positive integer")
        for name in (
            "checkpoint_every",
            "eval_every",
            "batch_size",
            "seq_len",
            "local_steps",
            "seed",
            "ranks_per_worker",
            "min_workers",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise bad(name, "must be a non-negative integer")
        for name in ("lr", "outer_lr", "outer_momentum", "gossip_step"):
            value = getattr(self, name)
            if value is None and name != "lr":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise bad(name, "must be a finite, non-negative number")
        if self.algorithm and self.algorithm not in ALGORITHMS:
            raise bad("algorithm", f"unknown algorithm {self.algorithm!r}")
        if self.on_bad_utf8 not in ("", "skip", "fail"):
            raise bad("on_bad_utf8", "must be 'skip' or 'fail'")
        if not self.dataset.startswith(DATASET_SCHEMES):
            raise bad("dataset", f"unknown dataset scheme in {self.dataset!r}")
        if self.checkpoint_store and not self.checkpoint_store.startswith(STORE_SCHEMES):
            raise bad("checkpoint_store", f"unknown store scheme in {self.checkpoint_store!r}")
        if not 8 <= len(self.request_id) <= 128:
            raise bad("request_id", "8-128 characters required")

    def to_proto(self) -> common_pb2.JobSpec:
        fields = {k: v for k, v in asdict(self).items() if v is not None}  # None: the server's default
        fields.pop("request_id")
        return common_pb2.JobSpec(**fields)

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        """Build from a mapping (a YAML job file); unknown keys are an ``InvalidJob``."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidJob(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])
        return cls(**data)
