"""The secrets a job's workers get: its derived checkpoint keys and its data source's credentials, each release audited."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cantata.security.audit import Action
from cantata.security.keys import KeyProvider
from cantata.server.datasource_store import DataSourceStore
from cantata.server.jobspec import dataset_source
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
        """The secret part of a worker's config: the job's keys and, for a data-source dataset, its credentials.

        The layout is what ``cantata.trainer.config.WorkerConfig.load`` reads; raises
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
        }
        source = dataset_source(job.spec.dataset)
        if source:
            data["credentials"] = self._data_sources.worker_credentials(job.tenant, source)
            data["dataset_key"] = self._data_sources.worker_dataset_key(job.tenant, source)
            self._audit.append(
                "server",
                Action.DATA_SOURCE_RELEASED,
                resource=source,
                tenant=job.tenant,
                details={"job": job.id, "with_shard_decryption": data["dataset_key"] is not None},
            )
        return {"checkpoint_keys": keys.to_dict(), "data": data}
