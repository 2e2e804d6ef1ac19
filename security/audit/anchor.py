"""External anchors: copies of the signed checkpoints in a blob store (S3, Azure Blob, a local directory).

Whoever can write the server's disk can cut the end of the log together with
the checkpoints that cover it; copies held elsewhere expose that. Each
checkpoint becomes one immutable object, ``<prefix>/<log id>/<index>.json``,
holding its canonical line; :func:`verify` takes those lines as ``anchored``.
"""

from __future__ import annotations

from pathlib import Path

from cantata.storage import BlobStore

from .layout import AuditLayout, LogIdentity
from .segments import read_file, split_lines

DEFAULT_PREFIX = "audit-anchor"


def _anchor_dir(prefix: str, log_id: str) -> str:
    return f"{prefix.rstrip('/')}/{log_id}/"


def export_checkpoints(directory: Path, store: BlobStore, *, prefix: str = DEFAULT_PREFIX) -> int:
    """Copy every checkpoint not yet in ``store``; return how many were copied.

    Copies are never overwritten: an anchored checkpoint stays what it was
    when first exported, whatever later happens to the local file.
    """
    layout = AuditLayout(Path(directory))
    identity = LogIdentity.read(layout)
    folder = _anchor_dir(prefix, identity.log_id)
    present = set(store.list(folder))
    copied = 0
    for line in split_lines(0, read_file(layout.checkpoints_path), final=True):
        if line.stored is None or not isinstance(line.stored.get("n"), int):
            continue
        key = f"{folder}{line.stored['n']:010d}.json"
        if key not in present:
            store.put(key, line.raw)
            copied += 1
    return copied


def read_anchor(directory: Path, store: BlobStore, *, prefix: str = DEFAULT_PREFIX) -> list[bytes]:
    """The anchored checkpoint lines of the log in ``directory``, in index order."""
    identity = LogIdentity.read(AuditLayout(Path(directory)))
    return [store.get_bytes(key) for key in store.list(_anchor_dir(prefix, identity.log_id))]
