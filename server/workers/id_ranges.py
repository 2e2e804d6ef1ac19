"""One server per worker uid range on a host: two whose ranges overlap would kill each other's workers.

A root server takes back a job's uid by killing every process of it
(:mod:`cantata.server.workers.uid_reclaim`), and gives its tenants' gids to their workers.
A second server on the same host whose ``worker_uid_base``/``worker_uid_count`` or
``tenant_gid_base``/``tenant_gid_count`` overlapped the first's would kill the
first's workers, or let its tenants read the first's tenants' data. Each root server
records its ranges in a host-wide registry (:data:`REGISTRY`, under ``/run``, under a
lock) at start; a server whose ranges overlap those of another live server (another
data directory) refuses to start with :class:`IdRangeInUse`. Entries of servers that
are gone (pid and start time) do not count.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from cantata.server.workers import process_identity

REGISTRY = Path("/run/cantata/id-ranges.json")


class IdRangeInUse(ValueError):
    """Another live server on this host uses some of this server's worker uids or tenant gids."""


def overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


@contextlib.contextmanager
def _locked(registry: Path) -> Iterator[list[dict]]:
    registry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(registry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        entries = json.loads(registry.read_text()) if registry.exists() else []
        live = [e for e in entries if process_identity.running(e["pid"], e["started"])]
        yield live
        temporary = registry.with_suffix(".tmp")
        temporary.write_text(json.dumps(live, indent=2) + "\n")
        temporary.replace(registry)
    finally:
        os.close(fd)


def register(data_dir: Path, uids: range, gids: range, registry: Path = REGISTRY) -> None:
    """Record this process's ranges for ``data_dir``; :class:`IdRangeInUse` if another live server's overlap.

    A worker's gid is its uid, so a server's ids are its uid range and its tenant gid range, in both senses.
    """
    ours = (uids, gids)
    with _locked(registry) as live:
        for entry in live:
            if entry["data_dir"] == str(data_dir):
                continue
            theirs = (range(*entry["uids"]), range(*entry["gids"]))
            if any(overlap(a, b) for a in ours for b in theirs):
                raise IdRangeInUse(
                    f"worker uids {uids.start}..{uids.stop - 1} or tenant gids {gids.start}..{gids.stop - 1} overlap "
                    f"those of the server of {entry['data_dir']} (pid {entry['pid']}: uids "
                    f"{theirs[0].start}..{theirs[0].stop - 1}, gids {theirs[1].start}..{theirs[1].stop - 1}): "
                    "give this one other worker_uid_base / tenant_gid_base in server.json"
                )
        live[:] = [e for e in live if e["data_dir"] != str(data_dir)]
        pid = os.getpid()
        live.append(
            {
                "data_dir": str(data_dir),
                "pid": pid,
                "started": process_identity.start_time(pid),
                "uids": [uids.start, uids.stop],
                "gids": [gids.start, gids.stop],
            }
        )


def unregister(data_dir: Path, registry: Path = REGISTRY) -> None:
    """Drop this process's entry for ``data_dir`` (a stopping server)."""
    with _locked(registry) as live:
        live[:] = [e for e in live if not (e["data_dir"] == str(data_dir) and e["pid"] == os.getpid())]
