"""How a freshly forked process becomes a worker: session, descriptors, user, directory, environment, memory.

The server decides what a worker gets (:mod:`cantata.server.sandbox`) and
sends it as a :class:`SpawnRequest`; the zygote's child applies it with
:func:`enter` before running a line of the worker, then
:func:`limit_memory` once the worker's modules are loaded.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from dataclasses import asdict, dataclass
from pathlib import Path


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

    def to_dict(self) -> dict:
        return asdict(self)


def _open_fds() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


def enter(request: SpawnRequest) -> None:
    """In a freshly forked child: become the worker ``request`` describes (session, files, user, directory, env)."""
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
    if request.uid is not None and request.gid is not None:
        os.setgroups([])
        os.setgid(request.gid)
        os.setuid(request.uid)
    os.umask(0o077)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)


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
