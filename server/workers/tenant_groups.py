"""A gid of its own per tenant, which its workers hold and its ``file://`` folders belong to.

As root, every worker of a tenant's jobs has the tenant's gid as its one
supplementary group (:class:`cantata.server.workers.sandbox.Identities`). The gids come
from ``tenant_gid_base`` up, given out in the order tenants first run a job and
recorded in ``D/tenant-gids.json`` (the server's, 0600): a tenant keeps its gid
for good, so that an operator may ``chgrp`` its data to it.

Before each launch the tenant's existing folder of every shared root
(``<root>/<tenant>/``) gets that group, mode ``02750``: other tenants' workers
cannot pass through it, whatever the modes of the files inside, and files put
there later inherit the group (the set-gid bit), so that being group-readable
(0640) is enough for the tenant's workers to read them. A root granted to one
tenant (``tenant_roots``) is the operator's to lay out the same way
(``cantata server tenant-gid`` says the gid).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

TENANT_FOLDER_MODE = 0o2750  # the owner's; the tenant's workers read; nobody else passes


class TenantGroups:
    """Each tenant's gid (allocated on first use, recorded in ``path``), and its folders' group."""

    def __init__(self, path: Path, base: int, count: int, folders: Callable[[str], list[Path]] = lambda tenant: []):
        self._path = path
        self._gids = range(base, base + count)
        self._folders = folders  # the tenant's file:// roots

    @property
    def gids(self) -> range:
        return self._gids

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, int]]:
        """The recorded gids, under an exclusive lock (``cantata server tenant-gid`` may run beside the server)."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            recorded = json.loads(self._path.read_text()) if self._path.exists() else {}
            before = dict(recorded)
            yield recorded
            if recorded != before:
                temporary = self._path.with_suffix(".tmp")
                temporary.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
                temporary.chmod(0o600)
                temporary.replace(self._path)
        finally:
            os.close(fd)

    def gid(self, tenant: str) -> int:
        """The tenant's gid, given now if it has none yet; ``RuntimeError`` when the range is used up."""
        with self._locked() as recorded:
            if tenant not in recorded:
                used = set(recorded.values())
                free = next((g for g in self._gids if g not in used), None)
                if free is None:
                    raise RuntimeError(
                        f"no free tenant gid in {self._gids.start}..{self._gids.stop - 1} (tenant_gid_count)"
                    )
                recorded[tenant] = free
            return recorded[tenant]

    def prepare(self, tenant: str) -> int:
        """Give the tenant's existing ``file://`` roots its group, mode 02750; its gid."""
        gid = self.gid(tenant)
        for folder in self._folders(tenant):
            if folder.is_dir() and not folder.is_symlink():
                os.chown(folder, -1, gid, follow_symlinks=False)
                folder.chmod(TENANT_FOLDER_MODE)
        return gid
