"""Byte-level text datasets with a fixed train/validation split.

``builtin:pystdlib`` is the Python standard library's own ``.py`` sources,
read from the running interpreter. ``file://DIR`` reads the text files under a
directory the server allowed. Files are assigned to train or validation by a
hash of their relative path, so the split never depends on file order.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

MAX_BYTES = 16 << 20  # enough text for a small model, bounded memory
TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst"}
VALIDATION_PERCENT = 5


@dataclass
class TextCorpus:
    train: torch.Tensor  # uint8 tokens
    val: torch.Tensor


def _files(root: Path, suffixes: set[str]) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file() and not p.is_symlink())


def _is_validation(relative: str) -> bool:
    return int(hashlib.sha256(relative.encode()).hexdigest(), 16) % 100 < VALIDATION_PERCENT


def load_corpus(dataset: str) -> TextCorpus:
    if dataset == "builtin:pystdlib":
        root, suffixes = Path(sysconfig.get_paths()["stdlib"]), {".py"}
    elif dataset.startswith("file://"):
        root, suffixes = Path(dataset.removeprefix("file://")), TEXT_SUFFIXES
    else:
        raise ValueError(f"unsupported dataset {dataset!r}")
    train, val, size = bytearray(), bytearray(), 0
    for path in _files(root, suffixes):
        if "site-packages" in path.parts or size >= MAX_BYTES:
            continue
        data = path.read_bytes()[: MAX_BYTES - size]
        size += len(data)
        relative = str(path.relative_to(root)) if path != root else path.name
        (val if _is_validation(relative) else train).extend(data)
    if len(val) == 0 or len(train) == 0:  # a single file: split by position instead
        whole = train + val
        cut = len(whole) * (100 - VALIDATION_PERCENT) // 100
        train, val = whole[:cut], whole[cut:]
    if len(train) < 2048 or len(val) < 512:
        raise ValueError(f"dataset {dataset!r} has too little text ({len(train) + len(val)} bytes)")
    return TextCorpus(torch.frombuffer(bytes(train), dtype=torch.uint8).clone(),
                      torch.frombuffer(bytes(val), dtype=torch.uint8).clone())


class BatchSampler:
    """Random windows for one worker; the stream is a pure function of (seed, worker, step)."""

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, seed: int, worker: int):
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.worker = seed, worker

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.worker * 10_007 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (self.batch_size,), generator=g)
        offsets = torch.arange(self.seq_len + 1)
        windows = self.tokens[starts[:, None] + offsets].long()
        return windows[:, :-1], windows[:, 1:]
