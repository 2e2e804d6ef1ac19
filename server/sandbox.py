"""What a worker process gets from the server, and nothing more.

- Environment: an allow-list (:data:`ALLOWED_ENV`) and the worker's own
  settings; never ``$CANTATA_MASTER_KEY``, cloud credentials or anything else
  of the server's. What a worker needs to reach its job's checkpoint store goes
  into its 0600 config file instead (:func:`store_environment`).
- File descriptors: stdin is ``/dev/null``, stdout and stderr its log; every
  other descriptor is closed.
- Working directory and ``$HOME``: its job's workspace, mode 0700.
- Identity: when the server runs as root, the workers of each job run as a
  user of their own, a uid (and gid) from ``worker_uid_base`` up with no entry
  in ``/etc/passwd`` and no supplementary groups (:class:`Identities`). The
  job's workspace and its ``file://`` checkpoint folder belong to that uid;
  the data directory's keys, database and audit log are the server's, 0600/0700
  (:func:`lock_data_dir`).
- Memory: ``RLIMIT_AS``, the process's size once its modules are loaded plus
  the job's budget (:func:`cantata.security.process_sandbox.limit_memory`).

:func:`cantata.security.process_sandbox.enter` applies it in each freshly forked
worker, before the worker runs a line of its own (see :mod:`cantata.server.zygote`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ALLOWED_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "PYTHONPATH",
    "CANTATA_THIRD_PARTY_LOG_LEVEL",
    "CANTATA_LOG_FORMAT",  # text or json worker logs (cantata.logformat)
)
# Cloud SDK settings a worker needs for the job's checkpoint store, by URI scheme (delivered in its config file).
STORE_ENV_PREFIXES = {"s3": ("AWS_",), "az": ("AZURE_",)}
PUBLIC_FILE_SUFFIX = ".pem"  # certificates in the data directory: readable by anyone
TRAVERSE_ONLY = 0o711  # a directory others may pass through but not list
SHARED_UPLOADS = 0o1733  # a store's .partial/: every job may create its own files, none may list or remove others'


@dataclass(frozen=True)
class Identity:
    """The uid and gid a job's workers run as."""

    uid: int
    gid: int


class Identities:
    """One unprivileged uid per running job, from ``base`` up; ``None`` when the server is not root.

    The ids have no ``/etc/passwd`` entry: they own nothing but the job's workspace
    and checkpoint folder, and no two running jobs share one.
    """

    def __init__(self, base: int, count: int, *, root: bool | None = None):
        self._ids = range(base, base + count)
        self._root = os.geteuid() == 0 if root is None else root
        self._taken: dict[str, int] = {}

    def acquire(self, job_id: str) -> Identity | None:
        if not self._root:
            return None
        if job_id not in self._taken:
            free = next((i for i in self._ids if i not in self._taken.values()), None)
            if free is None:
                raise RuntimeError(f"no free worker uid in {self._ids.start}..{self._ids.stop - 1}")
            self._taken[job_id] = free
        uid = self._taken[job_id]
        return Identity(uid, uid)

    def claim(self, job_id: str, uid: int) -> Identity | None:
        """The uid an earlier server gave ``job_id`` (its workspace's owner), taken again for its adopted workers."""
        if not self._root or uid not in self._ids:
            return self.acquire(job_id)
        self._taken[job_id] = uid
        return Identity(uid, uid)

    def release(self, job_id: str) -> None:
        self._taken.pop(job_id, None)


def base_environment() -> dict[str, str]:
    """The allow-listed part of the server's environment, the same for every worker."""
    env = {name: os.environ[name] for name in ALLOWED_ENV if name in os.environ}
    env.setdefault("PATH", "/usr/bin:/bin")
    # Few malloc arenas: each thread's 64 MiB arena would count against RLIMIT_AS. One OpenBLAS
    # thread: numpy's import would otherwise start a pool, and a zygote with threads must not fork.
    return {
        **env,
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MALLOC_ARENA_MAX": "2",
        "OPENBLAS_NUM_THREADS": "1",
    }


def store_environment(store_uri: str) -> dict[str, str]:
    """The server's cloud SDK settings that reach ``store_uri`` (none for ``file://``)."""
    prefixes = STORE_ENV_PREFIXES.get(store_uri.partition("://")[0], ())
    return {name: value for name, value in os.environ.items() if name.startswith(prefixes)} if prefixes else {}


def lock_data_dir(root: Path, passable: tuple[Path, ...]) -> None:
    """Make the data directory's secrets the server's alone.

    ``root`` and the directories in ``passable`` (the job workspaces, the default
    checkpoint store) can be passed through but not listed; certificates are
    public; every other file is 0600 and every other directory 0700. The
    server's umask becomes 077, so that what it creates later (the database's
    ``-wal`` and ``-shm``, audit segments) is its alone too.
    """
    os.umask(0o077)
    root.chmod(TRAVERSE_ONLY)
    for entry in root.iterdir():
        if entry.is_symlink():
            continue
        if entry in passable:
            entry.chmod(TRAVERSE_ONLY)
        elif entry.is_dir():
            entry.chmod(0o700)
        else:
            entry.chmod(0o644 if entry.name.endswith(PUBLIC_FILE_SUFFIX) else 0o600)


def give(path: Path, identity: Identity | None) -> None:
    """Hand ``path`` and everything under it to ``identity`` (no-op when workers run as the server's user)."""
    if identity is None:
        return
    os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
    if path.is_dir() and not path.is_symlink():
        for sub, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(sub, name), identity.uid, identity.gid, follow_symlinks=False)


def prepare_job_folder(store_root: Path, tenant: str, job_id: str, identity: Identity | None) -> None:
    """Let the job's workers write ``<store>/<tenant>/<job>/`` of a ``file://`` store, and nothing beside it."""
    tenant_dir = store_root / tenant
    tenant_dir.mkdir(parents=True, exist_ok=True)
    (store_root / ".partial").mkdir(exist_ok=True)
    if identity is not None:
        tenant_dir.chmod(TRAVERSE_ONLY)
        (store_root / ".partial").chmod(SHARED_UPLOADS)
    job_dir = tenant_dir / job_id
    job_dir.mkdir(mode=0o700, exist_ok=True)
    job_dir.chmod(0o700)
    give(job_dir, identity)
