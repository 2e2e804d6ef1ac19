"""A worker's configuration: the JSON file the launcher writes, parsed once at start."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format

from cantata.proto.v1 import common_pb2


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

    @classmethod
    def load(cls, path: Path) -> WorkerConfig:
        raw = json.loads(Path(path).read_text())
        spec = json_format.ParseDict(raw.pop("spec"), common_pb2.JobSpec())
        for key in ("ca", "cert", "key"):
            raw[key] = Path(raw[key])
        return cls(spec=spec, **raw)
