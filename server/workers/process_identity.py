"""Which process a pid names: its start time, so that a process that reused a worker's pid is never taken for it.

A pid alone is not an identity: once a process exits, the kernel may give its
pid to another. The start time (``/proc/<pid>/stat`` field 22, in clock ticks
since boot) does not change for the life of a process, so (pid, start time)
names one process for as long as the machine runs.
"""

from __future__ import annotations

from pathlib import Path

FINISHED = frozenset("ZXx")  # a zombie or a dead process: exited, only not yet reaped


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (from the state on), or None if there is no such pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses


def start_time(pid: int) -> int:
    """The start time of process ``pid`` in clock ticks since boot; 0 if there is none."""
    fields = _stat(pid)
    return int(fields[19]) if fields else 0


def running(pid: int, started_at: int) -> bool:
    """Whether the process that started at ``started_at`` with ``pid`` still runs (not exited, not a zombie)."""
    fields = _stat(pid)
    return bool(started_at) and fields is not None and int(fields[19]) == started_at and fields[0] not in FINISHED


def parent(pid: int) -> int:
    """The pid of process ``pid``'s parent; 0 if there is no such process."""
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def command_line(pid: int) -> list[str]:
    """Process ``pid``'s command line as words; empty if there is no such process (or it is a zombie).

    Split on whitespace as well as NULs: a process title set by ``setproctitle`` (a worker's) is one string.
    """
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").replace("\0", " ").split()
