"""A worker's configuration: the JSON file the launcher writes, parsed once at start."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import json_format

from cantata.proto.v1 import common_pb2
from cantata.trainer.data import DatasetAccess, DatasetKey, SourceCredentials


@dataclass(frozen=True)
class WorkerConfig:
    job_id: str
    tenant: str
    worker: int
    workers: int
    attempt: int
    server: str
    ca: Path
    cert: Path
    key: Path
    rendezvous: str
    checkpoint_keys: str  # this job's derived checkpoint keys (JSON), from the server
    threads: int
    spec: common_pb2.JobSpec
    attack: dict | None = None  # evaluation only: set by an admin, never by the tenant
    dataset_roots: tuple[str, ...] = ()  # where file:// datasets may live
    dataset_credentials: str | None = field(default=None, repr=False)  # the data source's, for this job only
    dataset_key: str | None = field(default=None, repr=False)  # the tenant's key for encrypted shards

    @property
    def ranks_per_worker(self) -> int:
        """Processes per decentralized worker group (``workers`` then counts groups)."""
        return self.spec.ranks_per_worker

    @property
    def group(self) -> int:
        """The decentralized worker group this process belongs to."""
        return self.worker // self.ranks_per_worker

    @property
    def group_rank(self) -> int:
        """This process's rank inside its worker group; rank 0 gossips for the group."""
        return self.worker % self.ranks_per_worker

    def gossip_process(self, group: int) -> int:
        """The process that gossips for worker group ``group``."""
        return group * self.ranks_per_worker

    def dataset_access(self) -> DatasetAccess:
        return DatasetAccess(
            roots=tuple(Path(root) for root in self.dataset_roots),
            credentials=SourceCredentials.from_json(self.dataset_credentials) if self.dataset_credentials else None,
            dataset_key=DatasetKey.from_json(self.dataset_key) if self.dataset_key else None,
        )

    @classmethod
    def load(cls, path: Path) -> WorkerConfig:
        raw = json.loads(Path(path).read_text())
        spec = json_format.ParseDict(raw.pop("spec"), common_pb2.JobSpec())
        for key in ("ca", "cert", "key"):
            raw[key] = Path(raw[key])
        raw["dataset_roots"] = tuple(raw.get("dataset_roots", ()))
        return cls(spec=spec, **raw)
