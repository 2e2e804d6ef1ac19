"""A tenant's tokenizer (a ``tokenizer.json`` through the ``tokenizers`` library) and the vocabulary a job reads.

``cantata data prepare --tokenizer FILE`` encodes text with it and records it
in every shard's header (:class:`~cantata.trainer.data.shards.TokenizerRecord`:
its vocabulary size and the SHA-256 of the file). A job names the tokenizer
(``tokenizer: sha256:...``) and its vocabulary size; the server refuses a
vocabulary larger than the model's at submit, and each worker checks every
shard it reads against :class:`Vocabulary`, so a token id the model has no
embedding for is an error naming the shard, never an index error in training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cantata.trainer.data.errors import TokenizerError, VocabularyError
from cantata.trainer.data.shards import ShardHeader, TokenizerRecord


@dataclass(frozen=True)
class TextTokenizer:
    """Encodes text into token ids with a loaded ``tokenizers.Tokenizer``."""

    record: TokenizerRecord
    _tokenizer: Any

    @classmethod
    def from_file(cls, path: Path) -> TextTokenizer:
        from tokenizers import Tokenizer  # the trainer's extra; the CLI loads it only for --tokenizer

        data = Path(path).read_bytes()
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except (UnicodeDecodeError, Exception) as error:  # the library raises a bare Exception for bad JSON
            raise TokenizerError(
                f"tokenizer {path} is not a tokenizer.json the tokenizers library loads: {error}"
            ) from None
        vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        return cls(TokenizerRecord(vocab_size, hashlib.sha256(data).digest()), tokenizer)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.uint32)


@dataclass(frozen=True)
class Vocabulary:
    """What a job's model can read: token ids below ``size``, from ``tokenizer`` (``sha256:...``; empty: any)."""

    size: int
    tokenizer: str = ""

    def check_shard(self, header: ShardHeader, tokens: np.ndarray, name: str) -> None:
        recorded = header.tokenizer
        if self.tokenizer and (recorded is None or recorded.name != self.tokenizer):
            made_by = "bytes (no tokenizer)" if recorded is None else f"tokenizer {recorded.name}"
            raise VocabularyError(f"shard {name} was made by {made_by}, the job names tokenizer {self.tokenizer}")
        self.check_tokens(tokens, name)

    def check_text(self, tokens: np.ndarray, name: str) -> None:
        """Text objects are read as bytes: refused when the job names a tokenizer."""
        if self.tokenizer:
            raise VocabularyError(
                f"text object {name} would be read as bytes, but the job names tokenizer {self.tokenizer}: "
                "prepare it with cantata data prepare --tokenizer"
            )
        self.check_tokens(tokens, name)

    def check_tokens(self, tokens: np.ndarray, name: str) -> None:
        if tokens.size and (top := int(tokens.max())) >= self.size:
            raise VocabularyError(f"shard {name} holds token id {top}, outside the model's vocabulary of {self.size}")
