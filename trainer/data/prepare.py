"""Turn local text (``*.txt``, ``*.jsonl``) into token shards: ``cantata data prepare``.

Tokens are UTF-8 bytes, or the ids of a tenant's tokenizer (``--tokenizer
tokenizer.json``), which every shard's header then records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cantata.trainer.data.errors import DataError, DatasetNotFoundError
from cantata.trainer.data.shards import SHARD_SUFFIX, TokenizerRecord, encode_shard
from cantata.trainer.data.text import TEXT_SUFFIXES, Utf8Policy, tokenize_object
from cantata.trainer.data.tokenizer import TextTokenizer

DEFAULT_SHARD_TOKENS = 1 << 22


@dataclass(frozen=True)
class PreparedShards:
    shards: list[Path]
    tokens: int
    files: int
    tokenizer: TokenizerRecord | None = None  # None: byte-level


def text_files(source: Path) -> list[Path]:
    """``source`` itself, or the text files below it, sorted."""
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise DatasetNotFoundError(f"text source {source} does not exist")
    files = sorted(p for p in source.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
    if not files:
        raise DatasetNotFoundError(f"text source {source} holds no {' or '.join('*' + s for s in TEXT_SUFFIXES)} files")
    return files


def prepare_shards(
    source: Path,
    out: Path,
    *,
    dtype: np.dtype,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    utf8_policy: Utf8Policy = Utf8Policy.FAIL,
    warn: Callable[[str], None] = print,
    progress: Callable[[str], None] = lambda message: None,
    tokenizer: TextTokenizer | None = None,
) -> PreparedShards:
    """Tokenize every text file under ``source`` into shards of ``shard_tokens`` tokens in ``out``."""
    if shard_tokens < 2:
        raise ValueError("a shard needs at least 2 tokens")
    record = tokenizer.record if tokenizer is not None else None
    if record is not None and record.vocab_size - 1 > np.iinfo(dtype).max:
        raise DataError(f"the tokenizer's vocabulary of {record.vocab_size} does not fit {dtype.name}; use uint32")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("*" + SHARD_SUFFIX)):
        raise DataError(f"output directory {out} already holds shards; use an empty one")
    files = text_files(source)
    written: list[Path] = []
    pending: list[np.ndarray] = []
    held = total = 0

    def flush(count: int) -> None:
        nonlocal pending, held
        tokens = np.concatenate(pending) if pending else np.empty(0, np.uint8)
        path = out / f"shard-{len(written):05d}{SHARD_SUFFIX}"
        path.write_bytes(encode_shard(tokens[:count], dtype, record))
        written.append(path)
        pending, held = [tokens[count:]], tokens.size - count
        progress(f"wrote {path.name} ({count:,} tokens)")

    for index, path in enumerate(files, start=1):
        name = str(path) if path == source else path.relative_to(source).as_posix()
        tokens = tokenize_object(path.read_bytes(), name, utf8_policy, warn)
        if tokenizer is not None:
            tokens = tokenizer.encode(tokens.tobytes().decode("utf-8"))
        pending.append(tokens)
        held += tokens.size
        total += tokens.size
        while held >= shard_tokens:
            flush(shard_tokens)
        progress(f"tokenized {index}/{len(files)} files")
    if held:
        flush(held)
    if not written:
        raise DataError(f"text source {source} produced no tokens")
    return PreparedShards(written, total, len(files), record)
