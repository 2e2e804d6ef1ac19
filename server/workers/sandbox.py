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
  in ``/etc/passwd``, for the job's workers' lifetime only, and their tenant's
  gid (:mod:`cantata.server.workers.tenant_groups`) as their one supplementary group
  (:class:`Identities`). The job's workspace and its ``file://`` checkpoint
  folder belong to that uid while they run, the server's again once they have
  exited (:mod:`cantata.server.workers.uid_reclaim`); the data directory's keys,
  database and audit log are the server's, 0600/0700 (:func:`lock_data_dir`),
  and every directory above it must let other users pass (:func:`check_passable`).
- Memory: ``RLIMIT_AS``, the process's size once its modules are loaded plus
  the job's budget (:func:`cantata.security.process_sandbox.limit_memory`).

:func:`cantata.security.process_sandbox.enter` applies it in each freshly forked
worker, before the worker runs a line of its own (see :mod:`cantata.server.workers.zygote`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from cantata.server.config import write_private
from cantata.server.workers.tenant_groups import TenantGroups
from cantata.storage import uri as stores

log = logging.getLogger(__name__)

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
PUBLIC_FILE_SUFFIX = ".pem"  # certificates in the data directory: readable by anyone
TRAVERSE_ONLY = 0o711  # a directory others may pass through but not list
TENANT_ONLY = 0o710  # a tenant's folder of a checkpoint store: its workers' group passes, nobody else
SHARED_UPLOADS = 0o1733  # a store's .partial/: every job may create its own files, none may list or remove others'


@dataclass(frozen=True)
class Identity:
    """The uid and gid a job's workers run as, and their supplementary groups (their tenant's gid)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass
class Lease:
    """A uid in use by a job, and the folders it may have written (``D/uids/<uid>.json``, the server's)."""

    uid: int
    job_id: str
    groups: list[int]
    folders: list[str]
    retired: str = ""  # why its cleanup failed: the uid is never used again

    @property
    def identity(self) -> Identity:
        return Identity(self.uid, self.uid, tuple(self.groups))


Reclaim = Callable[[Lease], float]  # kill the lease's uid's processes, hand back its files; seconds


class Identities:
    """One unprivileged uid per job from ``base`` up, for the job's workers' lifetime; ``None`` when not root.

    The ids have no ``/etc/passwd`` entry. A uid is handed out round-robin (the next one after the
    last given, not the lowest free) and recorded in a lease (``leases``/``<uid>.json``) with the
    folders the job's workers may write; :meth:`release` takes it back once the job's workers have
    exited (:func:`cantata.server.workers.uid_reclaim.reclaim`: no process of it left, nothing it wrote its
    own) and only then is it free. A uid whose cleanup failed is retired, for good (its lease says
    why): fail closed. :meth:`recover` reclaims the uids of leases an earlier server left.
    """

    def __init__(
        self,
        base: int,
        count: int,
        *,
        leases: Path | None = None,
        tenant_groups: TenantGroups | None = None,
        root: bool | None = None,
        on_retired: Callable[[Lease], None] = lambda lease: None,
    ):
        self._ids = range(base, base + count)
        self._root = os.geteuid() == 0 if root is None else root
        self._leases_dir = leases
        self._tenant_groups = tenant_groups
        self._on_retired = on_retired  # logged and audited by the server
        self._held: dict[str, Lease] = {}  # job id -> its lease
        self._left: dict[int, Lease] = {}  # leases an earlier server left, not claimed again: reclaim first
        self._retired: dict[int, Lease] = {}
        self._next = base
        if self._root and leases is not None:
            leases.mkdir(mode=0o700, parents=True, exist_ok=True)
            for path in leases.glob("*.json"):
                lease = Lease(**json.loads(path.read_text()))
                (self._retired if lease.retired else self._left)[lease.uid] = lease

    @property
    def uids(self) -> range:
        return self._ids

    def retired(self) -> list[int]:
        return sorted(self._retired)

    def _busy(self, uid: int) -> bool:
        return uid in self._retired or uid in self._left or any(lease.uid == uid for lease in self._held.values())

    def _save(self, lease: Lease) -> None:
        if self._leases_dir is not None:
            write_private(self._leases_dir / f"{lease.uid}.json", json.dumps(asdict(lease)).encode())

    def _groups(self, tenant: str) -> list[int]:
        return [self._tenant_groups.prepare(tenant)] if self._tenant_groups is not None and tenant else []

    def acquire(self, job_id: str, tenant: str = "", folders: tuple[Path, ...] = ()) -> Identity | None:
        """The job's identity, a uid given now if it holds none; ``folders`` join those its lease names."""
        if not self._root:
            return None
        lease = self._held.get(job_id)
        if lease is None:
            count = len(self._ids)
            offset = self._next - self._ids.start
            uid = next((u for k in range(count) if not self._busy(u := self._ids[(offset + k) % count])), None)
            if uid is None:
                raise RuntimeError(f"no free worker uid in {self._ids.start}..{self._ids.stop - 1}")
            self._next = uid + 1 if uid + 1 < self._ids.stop else self._ids.start
            lease = self._held[job_id] = Lease(uid, job_id, self._groups(tenant), [])
            self._save(lease)
        new = [str(f) for f in folders if str(f) not in lease.folders]
        if new:
            lease.folders += new
            self._save(lease)
        return lease.identity

    def claim(self, job_id: str, uid: int | None, tenant: str = "") -> Identity | None:
        """The uid an earlier server gave ``job_id``, taken again for its adopted workers: ``uid`` (its workspace's
        owner) or, where no workspace here tells (its workers run on other nodes), the one its lease names."""
        if uid is None:
            uid = next((u for u, lease in self._left.items() if lease.job_id == job_id), None)
            if uid is None:
                return self.acquire(job_id, tenant)
        left = self._left.get(uid)
        if not self._root or uid not in self._ids or uid in self._retired or (left and left.job_id != job_id):
            return self.acquire(job_id, tenant)
        lease = self._left.pop(uid, None) or Lease(uid, job_id, self._groups(tenant), [])
        self._held[job_id] = lease
        self._save(lease)
        return lease.identity

    def identity(self, job_id: str) -> Identity | None:
        lease = self._held.get(job_id)
        return lease.identity if lease else None

    def folders(self, job_id: str) -> tuple[Path, ...]:
        lease = self._held.get(job_id)
        return tuple(Path(f) for f in lease.folders) if lease else ()

    def release(self, job_id: str, reclaim: Reclaim) -> float | None:
        """Take the job's uid back (``reclaim``), then free it; retire it if that fails. Seconds it took."""
        lease = self._held.pop(job_id, None)
        return None if lease is None else self._take_back(lease, reclaim)

    def recover(self, reclaim: Reclaim) -> list[int]:
        """Reclaim the uids whose leases an earlier server left and no adopted job claimed; those it freed."""
        freed = []
        for uid, lease in sorted(self._left.items()):
            del self._left[uid]
            if self._take_back(lease, reclaim) is not None:
                freed.append(uid)
        return freed

    def _take_back(self, lease: Lease, reclaim: Reclaim) -> float | None:
        try:
            seconds = reclaim(lease)
        except Exception as error:  # fail closed: whatever went wrong, the uid is never used again
            lease.retired = f"{type(error).__name__}: {error}"
            self._retired[lease.uid] = lease
            self._save(lease)
            log.error("worker uid %d of job %s retired: its cleanup failed (%s)", lease.uid, lease.job_id, error)
            self._on_retired(lease)
            return None
        if self._leases_dir is not None:
            (self._leases_dir / f"{lease.uid}.json").unlink(missing_ok=True)
        log.debug("worker uid %d of job %s reclaimed in %.3f s", lease.uid, lease.job_id, seconds)
        return seconds


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
    scheme = stores.SCHEMES.get(stores.scheme_of(store_uri))
    prefixes = scheme.env_prefixes if scheme else ()
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


def prepare_job_folder(store_root: Path, tenant: str, job_id: str, identity: Identity | None) -> Path:
    """Let the job's workers write ``<store>/<tenant>/<job>/`` of a ``file://`` store, and nothing beside it; that folder.

    ``<store>/<tenant>/`` is passable by the tenant's group only (other tenants' workers cannot reach
    its jobs' checkpoints at all), or by anyone but not listable where workers have no tenant group.
    """
    tenant_dir = store_root / tenant
    tenant_dir.mkdir(parents=True, exist_ok=True)
    (store_root / ".partial").mkdir(exist_ok=True)
    if identity is not None:
        if identity.groups:
            os.chown(tenant_dir, -1, identity.groups[0], follow_symlinks=False)
            tenant_dir.chmod(TENANT_ONLY)
        else:
            tenant_dir.chmod(TRAVERSE_ONLY)
        (store_root / ".partial").chmod(SHARED_UPLOADS)
    job_dir = tenant_dir / job_id
    job_dir.mkdir(mode=0o700, exist_ok=True)
    job_dir.chmod(0o700)
    give(job_dir, identity)
    return job_dir


class WorkersBlocked(PermissionError):
    """A directory above the data directory keeps the workers' uids out (every job would fail)."""


def check_passable(data_dir: Path, *, root: bool | None = None) -> None:
    """As root, raise :class:`WorkersBlocked` unless other users may pass every existing directory above ``data_dir``.

    Each job's workers run as a uid of their own, whose working directory is ``D/jobs/<job>/``:
    a 0700 parent (``/root``, the usual container ``$HOME``) would fail every job at its start.
    """
    if not (os.geteuid() == 0 if root is None else root):
        return
    for folder in data_dir.resolve().parents:
        with contextlib.suppress(FileNotFoundError):
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                raise WorkersBlocked(
                    f"{folder} (mode {stat.S_IMODE(mode):04o}) keeps the workers out of the data directory "
                    f"{data_dir}: each job's workers run as a uid of their own, which must pass through every "
                    f"directory above it; run `chmod o+x {folder}` or choose a --data-dir outside it"
                )
