"""A worker's configuration: its launch (:mod:`cantata.proto.launch`, the 0600 file the executor writes,
deleted once the job's workers are gone), with the job's spec completed and its secrets typed.

Each secret is a JSON object of its own, parsed here into its type
(``JobKeys``, ``SourceCredentials``, ``DatasetKey``), none of which shows its
secrets in a ``repr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cantata.proto import jobfields
from cantata.proto.launch import DataSecrets, WorkerLaunch
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
        """The configuration in the launch file at ``path``; a :class:`~cantata.proto.launch.LaunchError` if it is
        not a launch."""
        return cls.of(WorkerLaunch.load(path))

    @classmethod
    def of(cls, launch: WorkerLaunch) -> WorkerConfig:
        return cls(
            job_id=launch.job_id,
            tenant=launch.tenant,
            worker=launch.worker,
            workers=launch.workers,
            attempt=launch.attempt,
            server=launch.server,
            ca=Path(launch.ca),
            cert=Path(launch.cert),
            key=Path(launch.key),
            rendezvous=launch.rendezvous,
            threads=launch.threads,
            spec=_spec(launch.spec),
            checkpoint_keys=JobKeys.from_dict(launch.secrets.checkpoint_keys),
            dataset_access=_dataset_access(launch.secrets.data),
            attack=launch.attack,
            fault=launch.fault,
            gossip_host=launch.gossip_host,
        )


def _spec(launched: common_pb2.JobSpec) -> common_pb2.JobSpec:
    """The job's spec, with the defaults of fields newer than the server that stored it filled in."""
    spec = common_pb2.JobSpec()
    spec.CopyFrom(launched)
    jobfields.fill_defaults(spec)
    return spec


def _dataset_access(data: DataSecrets) -> DatasetAccess:
    credentials, key, init = data.credentials, data.dataset_key, data.init_credentials
    return DatasetAccess(
        roots=tuple(Path(root) for root in data.roots),
        credentials=SourceCredentials.from_dict(credentials) if credentials else None,
        dataset_key=DatasetKey.from_dict(key) if key else None,
        init_credentials=SourceCredentials.from_dict(init) if init else None,
    )
