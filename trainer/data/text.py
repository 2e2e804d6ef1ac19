"""Plain text objects tokenized on the fly with the byte-level tokenizer.

The tokenizer of Cantata's models is the identity on UTF-8 bytes: token ``t``
is byte ``t`` (vocabulary 256). ``*.txt`` objects are taken whole;
``*.jsonl`` objects contribute the ``text`` field of each record, records
separated by a newline. Text that is not valid UTF-8 is handled by the
:class:`Utf8Policy`: ``FAIL`` raises :class:`TextEncodingError`; ``SKIP``
drops the object (or the record) and reports a warning naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from cantata.proto.vocabulary import Utf8Policy
from cantata.trainer.data.errors import TextEncodingError

TEXT_SUFFIXES = (".txt", ".jsonl")
VOCAB_SIZE = 256


def encode_text(text: str) -> np.ndarray:
    """Byte-level tokens of ``text``."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def tokenize_object(data: bytes, name: str, policy: Utf8Policy, warn: Callable[[str], None]) -> np.ndarray:
    """Tokens of a ``.txt`` or ``.jsonl`` object (empty if skipped under ``SKIP``)."""
    if name.endswith(".jsonl"):
        return _tokenize_jsonl(data, name, policy, warn)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        return _refuse(f"text file {name} is not valid UTF-8 (byte {error.start})", policy, warn)
    return np.frombuffer(data, dtype=np.uint8)


def _tokenize_jsonl(data: bytes, name: str, policy: Utf8Policy, warn: Callable[[str], None]) -> np.ndarray:
    texts = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            _refuse(f"record {where} is not valid UTF-8 (byte {error.start})", policy, warn)
            continue
        except json.JSONDecodeError as error:
            raise TextEncodingError(f"record {where} is not JSON: {error.msg}") from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise TextEncodingError(f'record {where} has no "text" string field')
        try:
            texts.append(text.encode("utf-8"))
        except UnicodeEncodeError:
            _refuse(f"record {where} holds unpaired surrogates, not valid UTF-8", policy, warn)
    return np.frombuffer(b"\n".join(texts), dtype=np.uint8)


def _refuse(message: str, policy: Utf8Policy, warn: Callable[[str], None]) -> np.ndarray:
    if policy is Utf8Policy.FAIL:
        raise TextEncodingError(message)
    warn(f"skipped: {message}")
    return np.empty(0, dtype=np.uint8)
