"""A small tmpfs a test can fill up, to see what a full disk does to what writes there (root only)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FILLER = ".filler"


@contextmanager
def small_tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """Mount a tmpfs of ``size`` on ``path`` (keeping what ``path`` held), unmount it after; skip unless root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill up needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here to mount a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    saved = path.with_name(path.name + ".before-tmpfs")
    path.rename(saved)
    path.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        path.rmdir()
        saved.rename(path)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        shutil.copytree(saved, path, dirs_exist_ok=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
        shutil.rmtree(saved, ignore_errors=True)


def fill(path: Path) -> Path:
    """Write a filler file on ``path``'s filesystem until it is full; delete the file to give the space back."""
    filler = path / FILLER
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler
