"""The built-in corpus: the Python standard library's ``.py`` sources, in memory.

``builtin:pystdlib`` needs no set-up, so demos and tests train on it. Files
are assigned to train or validation by a hash of their relative path, so the
split never depends on file order. Tenant datasets stream through
:mod:`~cantata.trainer.data.loader` instead.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from cantata.trainer.data.batch import Batch

MAX_BYTES = 16 << 20  # enough text for a small model, bounded memory
VALIDATION_PERCENT = 5


@dataclass
class TextCorpus:
    train: torch.Tensor  # uint8 tokens
    val: torch.Tensor


def _is_validation(relative: str) -> bool:
    return int(hashlib.sha256(relative.encode()).hexdigest(), 16) % 100 < VALIDATION_PERCENT


@functools.cache
def load_builtin_corpus() -> TextCorpus:
    """The standard library's sources (without site-packages), up to ``MAX_BYTES``; read once a process.

    The worker zygote reads it before it forks (:mod:`cantata.trainer.zygote`): its workers share it.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    train, val, size = bytearray(), bytearray(), 0
    for path in sorted(p for p in root.rglob("*.py") if p.is_file() and not p.is_symlink()):
        if "site-packages" in path.parts or size >= MAX_BYTES:
            continue
        data = path.read_bytes()[: MAX_BYTES - size]
        size += len(data)
        (val if _is_validation(str(path.relative_to(root))) else train).extend(data)
    return TextCorpus(
        torch.frombuffer(train, dtype=torch.uint8).clone(), torch.frombuffer(val, dtype=torch.uint8).clone()
    )


class BatchSampler:
    """Random windows for one worker; the stream is a pure function of (seed, worker, step).

    A batch's sample ids are its windows' start offsets in the corpus.
    """

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, seed: int, worker: int):
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.worker = seed, worker

    def batch(self, step: int) -> Batch:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.worker * 10_007 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (self.batch_size,), generator=g)
        offsets = torch.arange(self.seq_len + 1)
        windows = self.tokens[starts[:, None] + offsets].long()
        return Batch(windows[:, :-1], windows[:, 1:], starts)
