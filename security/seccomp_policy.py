"""The system calls a worker may not make: a deny-list seccomp filter, built with libseccomp (``pyseccomp``).

Every call of :data:`DENIED` fails with ``EPERM``: reading or steering other
processes (``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``,
``pidfd_getfd``), changing the mount table or the namespaces (``mount``,
``umount2``, the new mount API, ``pivot_root``, ``chroot``, ``unshare``,
``setns``, and ``clone`` with a ``CLONE_NEW*`` flag), loading code or filters
into the kernel (modules, ``kexec``, ``bpf``), and kernel surfaces a trainer
has no use for (``perf_event_open``, the keyrings, ``userfaultfd``,
``io_uring``, handles that open files past their folders' permissions,
swap, reboot, clocks, ``syslog``). ``clone3`` fails with ``ENOSYS``: a
filter cannot read its flags, and the C library falls back to ``clone``,
whose flags it can. Everything else is allowed, so torch, gloo and gRPC run
unchanged. Calls of another architecture's ABI (``int 0x80``, x32) are
killed, as libseccomp does by default.

The filter needs ``libseccomp.so.2``. Where it is missing, :func:`install`
raises :class:`SeccompUnavailable` and the worker does not start, unless the
operator turned the filter off (``worker_seccomp: false`` in ``server.json``).
"""

from __future__ import annotations

import errno
from types import ModuleType

DENIED = (
    # other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    # mounts, namespaces and the root
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # code and filters into the kernel
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    # kernel surfaces a trainer does not use
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "lookup_dcookie",
    "quotactl",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "iopl",
    "ioperm",
    "vhangup",
    "uselib",
)
# clone flags that make a namespace (linux/sched.h)
NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its Python binding) is missing: the worker cannot get its syscall filter."""


def library() -> ModuleType:
    """The libseccomp binding; :class:`SeccompUnavailable`, saying what to do, when it cannot load."""
    try:
        import pyseccomp  # type: ignore[import-untyped]
    except (ImportError, RuntimeError, OSError) as error:  # pyseccomp raises RuntimeError without libseccomp.so
        raise SeccompUnavailable(
            f"the worker syscall filter needs libseccomp.so.2 and pyseccomp ({error}); install them "
            "(apt-get install libseccomp2; pip install 'cantata[server]'), or set worker_seccomp: false in "
            "server.json to run workers without it"
        ) from error
    return pyseccomp


def install() -> None:
    """Load the filter into this process (single-threaded: its threads to come inherit it). Irreversible."""
    seccomp = library()
    deny = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED:
        rules.add_rule(deny, name)
    for flag in NAMESPACE_FLAGS.values():
        rules.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.load()
