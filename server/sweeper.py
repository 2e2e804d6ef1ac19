"""Reclaim what killed writers leave in checkpoint stores: local partial files, open S3 multipart uploads.

An upload interrupted by an exception aborts itself; one whose process was
killed cannot. :class:`OrphanSweeper` calls :meth:`BlobStore.sweep` on every
store the server's jobs use (and the default one) when the server starts and
then every ``interval`` seconds, removing unfinished uploads older than
``older_than``. It runs on a thread of its own, so a store that is slow or
down delays only the next sweep, never job placement. Azure Blob needs no
sweep: the service discards uncommitted blocks after seven days.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from cantata.server.periodic import PeriodicTask
from cantata.server.store import JobRecord, Store
from cantata.storage import StoreError, open_store

log = logging.getLogger(__name__)


class OrphanSweeper(PeriodicTask):
    def __init__(self, store: Store, default_store: str, *, older_than: float, interval: float):
        super().__init__("orphan-sweeper", interval, at_start=True)
        self._store = store
        self._default_store = default_store
        self._older_than = older_than

    def tick(self) -> int:
        return self.sweep()

    def store_uris(self) -> list[str]:
        """Every distinct checkpoint store of the server's jobs, the default store first."""
        uris = dict.fromkeys([self._default_store, *(job.spec.checkpoint_store for job in self._jobs())])
        return [uri for uri in uris if uri]

    def sweep(self) -> int:
        """Sweep each store once; return how many orphaned uploads were removed in all."""
        removed = 0
        for uri in self.store_uris():
            try:
                count = open_store(uri).sweep(self._older_than)
            except StoreError as exc:
                log.warning("cannot sweep orphaned uploads in %s: %s", uri, exc)
                continue
            if count:
                log.info("removed %d orphaned upload(s) older than %g s from %s", count, self._older_than, uri)
            removed += count
        return removed

    def _jobs(self) -> Iterator[JobRecord]:
        after = ""
        while page := self._store.jobs(after=after):
            yield from page
            after = page[-1].id
