"""A worker's configuration: the JSON file the launcher writes, parsed once at start.

The file (mode 0600, deleted once the job's workers are gone) holds::

    {"job_id": ..., "tenant": ..., "attempt": ..., "worker": ..., "workers": ...,
     "threads": ..., "rendezvous": ..., "server": ..., "ca": ..., "cert": ..., "key": ...,
     "gossip_host": ... (the node's cluster address; absent: 127.0.0.1),
     "spec": {JobSpec as JSON},
     "attack": {...} | null,
     "fault": {...} | null,
     "checkpoint_keys": {"tenant": ..., "job_id": ..., "keys": {VERSION: base64}},
     "data": {"roots": [...],
              "credentials": {"name": ..., "kind": ..., "endpoint": ..., "secrets": {...}} | null,
              "dataset_key": {"tenant": ..., "key": base64} | null,
              "init_credentials": {like "credentials", for an init_from store} | null}}

Each secret is a JSON object of its own, parsed here into its type
(``JobKeys``, ``SourceCredentials``, ``DatasetKey``), none of which shows its
secrets in a ``repr``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from cantata.proto import jobfields
from cantata.proto.v1 import common_pb2
from cantata.security.keys import JobKeys
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
    threads: int
    spec: common_pb2.JobSpec
    checkpoint_keys: JobKeys = field(repr=False)  # this job's derived checkpoint keys, from the server
    dataset_access: DatasetAccess  # where file:// datasets may live; the data sources' secrets
    attack: dict | None = None  # evaluation only: set by an admin, never by the tenant
    fault: dict | None = None  # evaluation only, likewise: a planned loss fault (cantata.proto.faults)
    gossip_host: str = "127.0.0.1"  # the address the gossip endpoint binds (named in the worker's certificate)

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
        """Worker group ``group``'s rank-0 process: its gossip endpoint, or its representative when sharded."""
        return group * self.ranks_per_worker

    @property
    def sharded(self) -> bool:
        """Whether each worker group shards its model over its ranks (FSDP2, ``dp_shard`` = ``ranks_per_worker``).

        Then every rank gossips its own shard with the same rank of the peer groups.
        """
        return self.ranks_per_worker > 1 and self.spec.dp_shard == self.ranks_per_worker

    def shard_peer(self, group: int) -> int:
        """The process this one swaps its shard with in worker group ``group``: that group's rank of the same index."""
        return group * self.ranks_per_worker + self.group_rank

    @classmethod
    def load(cls, path: Path) -> WorkerConfig:
        raw = json.loads(Path(path).read_text())
        return cls(
            job_id=raw["job_id"],
            tenant=raw["tenant"],
            worker=raw["worker"],
            workers=raw["workers"],
            attempt=raw["attempt"],
            server=raw["server"],
            ca=Path(raw["ca"]),
            cert=Path(raw["cert"]),
            key=Path(raw["key"]),
            rendezvous=raw["rendezvous"],
            threads=raw["threads"],
            spec=_spec(raw["spec"]),
            checkpoint_keys=JobKeys.from_dict(raw["checkpoint_keys"]),
            dataset_access=_dataset_access(raw["data"]),
            attack=raw.get("attack"),
            fault=raw.get("fault"),
            gossip_host=raw.get("gossip_host", "127.0.0.1"),
        )


def _spec(raw: dict[str, Any]) -> common_pb2.JobSpec:
    """The job's spec, with the defaults of fields newer than the server that stored it filled in."""
    spec = json_format.ParseDict(raw, common_pb2.JobSpec())
    jobfields.fill_defaults(spec)
    return spec


def _dataset_access(data: dict[str, Any]) -> DatasetAccess:
    credentials, key, init = data.get("credentials"), data.get("dataset_key"), data.get("init_credentials")
    return DatasetAccess(
        roots=tuple(Path(root) for root in data.get("roots", ())),
        credentials=SourceCredentials.from_dict(credentials) if credentials else None,
        dataset_key=DatasetKey.from_dict(key) if key else None,
        init_credentials=SourceCredentials.from_dict(init) if init else None,
    )
