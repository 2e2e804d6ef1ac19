"""How a freshly forked process becomes a worker: session, descriptors, user, confinement, directory, environment, memory.

The server decides what a worker gets (:mod:`cantata.server.workers.sandbox`) and
sends it as a :class:`SpawnRequest`; the zygote's child applies it with
:func:`enter` before running a line of the worker, then
:func:`limit_memory` once the worker's modules are loaded. The confinement
(its own ``/proc`` that hides other users' processes, a task limit,
no new privileges, a syscall filter) is :mod:`cantata.security.worker_confinement`
and :mod:`cantata.security.seccomp_policy`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cantata.security import seccomp_policy
from cantata.security.worker_confinement import forbid_new_privileges, hide_other_processes, limit_tasks


@dataclass(frozen=True)
class SpawnRequest:
    """Everything a worker process is started with (sent to the zygote as JSON)."""

    argv: list[str]  # the arguments of ``entry``
    entry: str  # "module:function" to run, given argv; returns the exit code
    title: str  # its command line as ``ps`` and /proc/<pid>/cmdline show it
    env: dict[str, str]
    cwd: str
    log: str
    uid: int | None
    gid: int | None
    memory_bytes: int  # 0: no limit
    status: str = ""  # where the zygote writes how it exited ({"pid", "code"}), for a server started after it
    max_tasks: int = 0  # RLIMIT_NPROC: processes and threads of its uid (0: no limit)
    seccomp: bool = True  # the syscall filter; False only where the operator turned it off
    groups: list[int] = field(default_factory=list)  # supplementary groups with ``uid`` (its tenant's gid)

    def to_dict(self) -> dict:
        return asdict(self)


def _open_fds() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


def enter(request: SpawnRequest) -> None:
    """In a freshly forked child: become the worker ``request`` describes (session, files, user, confinement,
    directory, env). Fails (the worker does not start) if the syscall filter is asked for and cannot be loaded."""
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    log = os.open(request.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in _open_fds():
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
                os.close(fd)
    if request.seccomp:
        seccomp_policy.library()  # loaded while every library folder is still readable
    pinned = _pin_library_folders() if request.uid is not None else {}
    visible = hide_other_processes() if request.uid is not None else ""
    if request.uid is not None and request.gid is not None:
        os.setgroups(request.groups)
        os.setgid(request.gid)
        os.setuid(request.uid)
    limit_tasks(request.max_tasks if request.uid is not None else 0)  # the limit counts every task of the uid
    forbid_new_privileges()
    if request.seccomp:
        seccomp_policy.install()
    if visible:
        print(f"cantata sandbox: other users' processes stay visible in /proc ({visible})", file=sys.stderr)
    _repoint(pinned)
    os.umask(0o077)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)


def _reachable_by_others(folder: Path) -> bool:
    return all(not part.exists() or part.stat().st_mode & 0o001 for part in (folder, *folder.parents))


def _pin_library_folders() -> dict[str, str]:
    """Open (``O_PATH``) the import folders another user could not pass to (an interpreter under ``/root``).

    The worker's uid reaches them through ``/proc/self/fd/N``, which does not pass through their
    parents: it can import the rest of the standard library, and nothing beside it.
    """
    pinned = {}
    for entry in sys.path:
        if entry and os.path.isdir(entry) and not _reachable_by_others(Path(entry)):
            pinned[entry] = f"/proc/self/fd/{os.open(entry, os.O_PATH | os.O_DIRECTORY)}"
    return pinned


def _repoint(pinned: dict[str, str]) -> None:
    """Import through the pinned descriptors: ``sys.path`` and the ``__path__`` of loaded packages."""
    if not pinned:
        return

    def moved(path: str) -> str:
        for old, new in pinned.items():
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old) :]
        return path

    sys.path[:] = [moved(entry) for entry in sys.path]
    for module in list(sys.modules.values()):
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [moved(path) for path in paths]
    sys.path_importer_cache.clear()


def virtual_size() -> int:
    """This process's address-space size in bytes (VmSize)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def limit_memory(budget_bytes: int) -> None:
    """Cap this process's address space at its present size plus ``budget_bytes``.

    Called once the worker's modules are loaded, so the budget is what training
    may allocate; past it an allocation fails (``MemoryError`` or torch's
    "can't allocate memory"), and the worker reports that it ran out of memory.
    """
    if budget_bytes > 0:
        limit = virtual_size() + budget_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
