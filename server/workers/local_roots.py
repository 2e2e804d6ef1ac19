"""Where a tenant's ``file://`` datasets and checkpoint stores may be.

Each tenant sees only its own folder of every shared root (``allowed_roots``
in ``server.json``: ``<root>/<tenant>/...``), whole roots the admin granted
to it alone (``tenant_roots``), and, for checkpoint stores, its folder of the
default store (``D/checkpoints/<tenant>/``) or the default store itself, whose
layout already puts every object under ``<tenant>/<job>/``. Nothing else of
the platform's data directory is ever a root, whatever the settings say,
and no place under a shared root but the tenant's own folder, whatever the
admin granted: the rest of a shared root is other tenants'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


def within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass(frozen=True)
class LocalRoots:
    data_dir: Path  # never a root (but for the default store's tenant folders)
    default_store: Path  # D/checkpoints
    shared: tuple[Path, ...] = ()  # each tenant gets <root>/<tenant>
    granted: dict[str, tuple[Path, ...]] = field(default_factory=dict)  # tenant -> roots of its own

    def own_folders(self, tenant: str) -> list[Path]:
        """``tenant``'s folder of each shared root: the only part of that root that is its."""
        return [root / tenant for root in self.shared]

    def datasets(self, tenant: str) -> list[Path]:
        """The roots of ``tenant``'s ``file://`` datasets."""
        return [*self.own_folders(tenant), *self.granted.get(tenant, ())]

    def stores(self, tenant: str) -> list[Path]:
        """The roots of ``tenant``'s ``file://`` checkpoint stores."""
        return [self.default_store / tenant, *self.datasets(tenant)]
