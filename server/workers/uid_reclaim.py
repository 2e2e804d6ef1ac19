"""Take a job's uid back once its workers are gone: no process of it left, nothing it wrote still its own.

Run as root on the node the workers ran on, before the uid is handed to another job
(:class:`cantata.server.workers.sandbox.Identities`):

1. :func:`kill_uid`: a process of that uid (``/bin/sh``, which every host has) runs
   ``kill -KILL -1`` until none is left: ``kill(-1)`` from an unprivileged uid reaches
   exactly the processes of that uid (a worker's double-forked, ``setsid`` children
   included), and is atomic with respect to ``fork``; ``/proc`` must then show none.
2. :func:`hand_back`: the job's folders (its workspace, its ``file://`` checkpoint
   folder) become the server's again, entry by entry, only those the uid owns, never
   through a symbolic link.
3. :func:`remove_leftovers`: what the uid left in the world-writable scratch places
   (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``, ``/dev/mqueue``) is deleted.

Anything that fails raises :class:`ReclaimError`; the caller then never uses the uid again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

SCRATCH = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/run/lock"), Path("/dev/mqueue"))  # noqa: S108
KILL_ROUNDS = 20  # each round: one kill(-1) loop as the uid, then a look at /proc
SHELL = "/bin/sh"
KILL_LOOP = "i=0; while kill -KILL -1 2>/dev/null && [ $i -lt 1000 ]; do i=$((i+1)); done"


class ReclaimError(RuntimeError):
    """A uid could not be taken back (a process of it survived, or a file of it could not be handed back)."""


def processes_of(uid: int) -> list[int]:
    """The pids of the live (not zombie) processes whose real, effective or saved uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            text = Path(entry.path, "status").read_text()
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            if fields.get("State", "").split()[:1] != ["Z"] and uid in map(int, fields["Uid"].split()[:3]):
                found.append(int(entry.name))
    return found


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``; :class:`ReclaimError` if one is still there after :data:`KILL_ROUNDS`."""
    for _ in range(KILL_ROUNDS):
        if not processes_of(uid):
            return
        subprocess.run(
            [SHELL, "-c", KILL_LOOP], user=uid, group=uid, extra_groups=[], cwd="/", env={}, check=False, timeout=60
        )
    survivors = processes_of(uid)
    if survivors:
        raise ReclaimError(f"uid {uid}: processes {survivors} survived SIGKILL")


def _owned_by(path: str, uid: int) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return os.lstat(path).st_uid == uid
    return False


def hand_back(folders: Iterable[Path], uid: int) -> int:
    """Give what ``uid`` owns in ``folders`` (and the folders) to this process's user; how many entries."""
    owner, group = os.geteuid(), os.getegid()
    moved = 0
    for folder in folders:
        if not folder.exists() and not folder.is_symlink():
            continue
        paths = [str(folder)]
        if folder.is_dir() and not folder.is_symlink():
            for sub, dirs, files in os.walk(folder):
                paths += [os.path.join(sub, name) for name in dirs + files]
        for path in paths:
            if _owned_by(path, uid):
                os.chown(path, owner, group, follow_symlinks=False)
                moved += 1
    return moved


def _reachable(entry: os.stat_result, uid: int, groups: set[int]) -> bool:
    """Whether ``uid`` (with ``groups``) may pass through a directory with this status."""
    if entry.st_uid == uid:
        return True
    return bool(entry.st_mode & (stat.S_IXGRP if entry.st_gid in groups else stat.S_IXOTH))


def remove_leftovers(uid: int, groups: Iterable[int] = (), places: Iterable[Path] = SCRATCH) -> list[str]:
    """Delete what ``uid`` owns under the scratch ``places``; the paths deleted.

    Only directories the uid could pass through are searched: it can have written nowhere else.
    """
    member = {uid, *groups}
    removed: list[str] = []
    for place in places:
        if not place.is_dir():
            continue
        pending = [str(place)]
        while pending:
            folder = pending.pop()
            with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    if info.st_uid == uid:
                        if stat.S_ISDIR(info.st_mode):
                            shutil.rmtree(entry.path)
                        else:
                            os.unlink(entry.path)
                        removed.append(entry.path)
                    elif stat.S_ISDIR(info.st_mode) and _reachable(info, uid, member):
                        pending.append(entry.path)
    return removed


def reclaim(uid: int, groups: Iterable[int], folders: Iterable[Path]) -> float:
    """Kill, hand back, remove leftovers (see the module); the seconds it took. :class:`ReclaimError` if it cannot."""
    started = time.monotonic()
    try:
        kill_uid(uid)
        hand_back(folders, uid)
        remove_leftovers(uid, groups)
    except ReclaimError:
        raise
    except (OSError, subprocess.SubprocessError) as error:
        raise ReclaimError(f"uid {uid}: {error}") from error
    return time.monotonic() - started
