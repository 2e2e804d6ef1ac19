"""Plaintext checkpoints in a local directory.

``<dir>/step-<N>/`` holds ``model.pt``, one ``optim-<rank>.pt`` per rank and
``manifest.json``, written last (after every file is fsynced): a step
directory without its manifest is ignored, so a crash mid-write leaves the
previous checkpoint as the latest. Loading uses ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

MANIFEST = "manifest.json"


def _fsync_write(path: Path, write) -> int:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path.stat().st_size


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def save_shard(root: Path, step: int, name: str, state: dict) -> int:
    """Write one shard (e.g. ``model`` or ``optim-0``) of checkpoint ``step``; returns its size."""
    folder = step_dir(root, step)
    folder.mkdir(parents=True, exist_ok=True)
    return _fsync_write(folder / f"{name}.pt", lambda f: torch.save(state, f))


def commit(root: Path, step: int, shards: list[str], keep_last: int = 3) -> int:
    """Write the manifest that makes checkpoint ``step`` exist; prune old ones. Returns total bytes."""
    folder = step_dir(root, step)
    sizes = {name: (folder / f"{name}.pt").stat().st_size for name in shards}
    _fsync_write(folder / MANIFEST, lambda f: f.write(json.dumps({"step": step, "shards": sizes}).encode()))
    for old in committed_steps(root)[:-keep_last]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return sum(sizes.values())


def committed_steps(root: Path) -> list[int]:
    """Steps whose manifest exists and lists files that are all present, oldest first."""
    steps = []
    for manifest in root.glob(f"step-*/{MANIFEST}"):
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        folder = manifest.parent
        if all((folder / f"{n}.pt").stat().st_size == size if (folder / f"{n}.pt").exists() else False
               for n, size in meta["shards"].items()):
            steps.append(int(meta["step"]))
    return sorted(steps)


def load_shard(root: Path, step: int, name: str) -> dict:
    return torch.load(step_dir(root, step) / f"{name}.pt", weights_only=True)
