"""The secrets a job's workers get: its derived checkpoint keys and its data sources' credentials, each release audited."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cantata.security.audit import Action
from cantata.security.keys import KeyProvider
from cantata.server.datasource_store import DataSourceStore
from cantata.server.jobspec import job_sources
from cantata.server.ports import AuditSink
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

    def worker_secrets(self, job: JobRecord) -> dict[str, Any]:
        """The secret part of a worker's config: the job's keys and its data sources' credentials.

        The sources are those its ``dataset`` and ``init_from`` name, each released, and audited, once. The layout is what ``cantata.trainer.config.WorkerConfig.load`` reads; raises
        ``DataSourceError`` if the job's data source is gone.
        """
        keys = self._keyring.job_keys(job.tenant, job.id)
        self._audit.append(
            "server",
            Action.KEY_UNWRAPPED,
            resource=job.id,
            tenant=job.tenant,
            details={"purpose": "job keys for workers", "versions": keys.versions},
        )
        data: dict[str, Any] = {
            "roots": [str(root) for root in self._dataset_roots(job.tenant)],
            "credentials": None,
            "dataset_key": None,
            "init_credentials": None,
        }
        sources = job_sources(job.spec)
        released: dict[str, dict[str, Any]] = {}
        for source in dict.fromkeys(sources.values()):  # each source once, however many fields name it
            released[source] = self._data_sources.worker_credentials(job.tenant, source)
            if source == sources.get("dataset"):
                data["dataset_key"] = self._data_sources.worker_dataset_key(job.tenant, source)
            self._audit.append(
                "server",
                Action.DATA_SOURCE_RELEASED,
                resource=source,
                tenant=job.tenant,
                details={
                    "job": job.id,
                    "for": [field for field, named in sources.items() if named == source],
                    "with_shard_decryption": source == sources.get("dataset") and data["dataset_key"] is not None,
                },
            )
        if "dataset" in sources:
            data["credentials"] = released[sources["dataset"]]
        if "init_from" in sources:
            data["init_credentials"] = released[sources["init_from"]]
        return {"checkpoint_keys": keys.to_dict(), "data": data}
