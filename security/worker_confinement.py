"""What a worker can no longer do once it is its job's user: see others' processes, gain privileges, fork without end.

:func:`cantata.security.process_sandbox.enter` applies these in the freshly
forked worker:

- :func:`hide_other_processes`, as root before it drops to the job's uid:
  a mount namespace of its own, whose ``/proc`` is a new instance mounted
  ``hidepid=invisible``: the worker sees only the processes of its own uid
  (its job's workers on this node), not the server's, the zygote's or other
  jobs'. Where the kernel refuses (not root, or a kernel older than 5.8,
  whose ``/proc`` mounts share one set of options), the worker starts
  anyway and its log says why; ``mount -o remount,hidepid=invisible /proc``
  on the host then hides them for every process.
- :func:`limit_tasks`: ``RLIMIT_NPROC``, which counts the processes *and
  threads* of the uid, so one bound covers all the job's workers on the node
  (:func:`task_limit`).
- :func:`forbid_new_privileges`: ``PR_SET_NO_NEW_PRIVS``: no exec can raise
  its privileges (setuid binaries, file capabilities); it is also what lets
  an unprivileged process load a seccomp filter
  (:mod:`cantata.security.seccomp_policy`).
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_SLAVE = 0x2, 0x4, 0x8, 0x4000, 0x80000
PR_SET_NO_NEW_PRIVS = 38
HIDDEN_PROC_OPTIONS = b"hidepid=invisible"  # Linux >= 5.8: each proc mount has options of its own
DEFAULT_TASK_ALLOWANCE = 128  # measured: 12 to 15 per process on 2 cores; gRPC and gloo pools grow with cores

_libc = ctypes.CDLL(None, use_errno=True)


class ConfinementError(OSError):
    """A confinement step the kernel refused, where the worker must not start without it."""


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise ConfinementError(code, f"{what}: {os.strerror(code)}")


def hide_other_processes() -> str:
    """Give this process a mount namespace whose ``/proc`` hides other uids' processes; "" or why it could not."""
    try:
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # the host's later mounts (a checkpoint store's) still reach this namespace; none goes back
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        _check(_libc.mount(b"proc", b"/proc", b"proc", flags, HIDDEN_PROC_OPTIONS), "mount proc hidepid=invisible")
    except ConfinementError as refused:
        return str(refused)
    return ""


def task_limit(processes: int, threads: int, allowance: int) -> int:
    """``RLIMIT_NPROC`` for a job's uid: its ``processes`` each with ``threads`` compute threads plus ``allowance``
    tasks (the runtime's own threads, measured in docs/security.md#worker-sandbox); 0: no limit."""
    return processes * (threads + allowance) if allowance > 0 else 0


def limit_tasks(limit: int) -> None:
    """Cap the tasks (processes and threads) of this process's real uid at ``limit`` (0: leave it)."""
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))


def forbid_new_privileges() -> None:
    """``PR_SET_NO_NEW_PRIVS``: irreversible, inherited by every child and exec."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


@dataclass(frozen=True)
class ConfinementPolicy:
    """The operator's settings for every worker (``server.json``), made into each worker's spawn request fields."""

    seccomp: bool = True  # worker_seccomp: False runs workers without the syscall filter
    task_allowance: int = DEFAULT_TASK_ALLOWANCE  # worker_task_allowance: 0 sets no task limit

    def request_fields(self, processes: int, threads: int) -> dict:
        """``max_tasks`` and ``seccomp`` of a :class:`~cantata.security.process_sandbox.SpawnRequest` for a
        worker of a job of ``processes`` worker processes of ``threads`` compute threads each."""
        return {"max_tasks": task_limit(processes, threads, self.task_allowance), "seccomp": self.seccomp}


DEFAULT_POLICY = ConfinementPolicy()
