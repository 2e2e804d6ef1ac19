"""The secrets a job's workers get: its derived checkpoint keys and its data sources' credentials, each release audited."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cantata.proto.launch import DataSecrets, WorkerSecrets
from cantata.security.audit import Action
from cantata.security.keys import KeyProvider
from cantata.server.datasource_store import DataSourceStore
from cantata.server.jobs.jobspec import job_sources
from cantata.server.network.ports import AuditSink
from cantata.server.store import JobRecord


class SecretsBroker:
    """Releases to a job's workers what only they may hold, and records each release."""

    def __init__(
        self,
        keyring: KeyProvider,
        data_sources: DataSourceStore,
        audit: AuditSink,
        dataset_roots: Callable[[str], list[Path]],
    ):
        self._keyring = keyring
        self._data_sources = data_sources
        self._audit = audit
        self._dataset_roots = dataset_roots  # tenant -> where its file:// datasets may be

    def worker_secrets(self, job: JobRecord) -> WorkerSecrets:
        """The secret part of a worker's launch: the job's keys and its data sources' credentials.

        The sources are those its ``dataset`` and ``init_from`` name, each released, and audited, once;
        raises ``DataSourceError`` if the job's data source is gone.
        """
        keys = self._keyring.job_keys(job.tenant, job.id)
        self._audit.append(
            "server",
            Action.KEY_UNWRAPPED,
            resource=job.id,
            tenant=job.tenant,
            details={"purpose": "job keys for workers", "versions": keys.versions},
        )
        dataset_key = None
        sources = job_sources(job.spec)
        released: dict[str, dict[str, Any]] = {}
        for source in dict.fromkeys(sources.values()):  # each source once, however many fields name it
            released[source] = self._data_sources.worker_credentials(job.tenant, source)
            if source == sources.get("dataset"):
                dataset_key = self._data_sources.worker_dataset_key(job.tenant, source)
            self._audit.append(
                "server",
                Action.DATA_SOURCE_RELEASED,
                resource=source,
                tenant=job.tenant,
                details={
                    "job": job.id,
                    "for": [field for field, named in sources.items() if named == source],
                    "with_shard_decryption": source == sources.get("dataset") and dataset_key is not None,
                },
            )
        data = DataSecrets(
            roots=tuple(str(root) for root in self._dataset_roots(job.tenant)),
            credentials=released[sources["dataset"]] if "dataset" in sources else None,
            dataset_key=dataset_key,
            init_credentials=released[sources["init_from"]] if "init_from" in sources else None,
        )
        return WorkerSecrets(keys.to_dict(), data)
