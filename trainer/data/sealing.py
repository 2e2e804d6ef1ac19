"""Encrypted shards: the tenant's data key and the checkpoint streaming AEAD.

``cantata data upload --encrypt`` seals each shard with
:mod:`cantata.security.stream_aead` (the format of encrypted checkpoints)
before it leaves the tenant's machine, so the store only ever holds
ciphertext. Each object's fresh data key is wrapped by the tenant's
*dataset key*, which never leaves the tenant except to the platform's
workers, and the stream context binds the tenant and the object's key in the
dataset (``StreamContext(tenant, "dataset", 0, key)``), so an object renamed,
swapped or moved to another tenant is refused.

The dataset key is a JSON file ``dataset-key.json`` (mode 0600) in the
tenant's profile (its format is :mod:`cantata.dataset_key`). A worker gets
the same document in its private config (see :mod:`cantata.trainer.data`).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cantata import dataset_key as key_file
from cantata.dataset_key import KEY_FILE as KEY_FILE  # the profile's key file, for the data CLI
from cantata.dataset_key import KEY_SIZE
from cantata.security.stream_aead import IntegrityError, StreamContext, StreamDecryptor, StreamEncryptor
from cantata.trainer.data.errors import DataError, SealedShardError

SEALED_SUFFIX = ".sealed"
DATASET_JOB = "dataset"
NONCE_SIZE = 12
_WRAP_LABEL = b"cantata/dataset-key-wrap/v1\x00"


@dataclass(frozen=True)
class DatasetKey:
    """A tenant's key for sealing dataset objects: wraps and unwraps their data keys."""

    tenant: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) != KEY_SIZE:
            raise DataError(f"a dataset key has {KEY_SIZE} bytes, not {len(self.secret)}")

    @classmethod
    def generate(cls, tenant: str) -> DatasetKey:
        return cls(tenant, os.urandom(KEY_SIZE))

    def _aad(self) -> bytes:
        return _WRAP_LABEL + struct.pack(">H", len(self.tenant.encode())) + self.tenant.encode()

    def wrap(self, data_key: bytes) -> bytes:
        nonce = os.urandom(NONCE_SIZE)
        return nonce + AESGCM(self.secret).encrypt(nonce, data_key, self._aad())

    def unwrap(self, envelope: bytes) -> bytes:
        try:
            return AESGCM(self.secret).decrypt(envelope[:NONCE_SIZE], envelope[NONCE_SIZE:], self._aad())
        except (InvalidTag, ValueError):
            raise IntegrityError(f"data key was not wrapped by {self.tenant}'s dataset key") from None

    def to_json(self) -> str:
        return key_file.dumps(self.tenant, self.secret)

    @classmethod
    def from_json(cls, text: str) -> DatasetKey:
        try:
            document = json.loads(text)
        except ValueError as error:
            raise DataError(f"invalid dataset key document: {error}") from None
        return cls.from_dict(document)

    @classmethod
    def from_dict(cls, document: Any) -> DatasetKey:
        try:
            return cls(*key_file.from_document(document))
        except ValueError as error:
            raise DataError(str(error)) from None

    @classmethod
    def load_or_create(cls, path: Path, tenant: str) -> DatasetKey:
        """The key in ``path``, made (mode 0600) on first use."""
        try:
            return cls(*key_file.load_or_create(path, tenant))
        except ValueError as error:
            raise DataError(str(error)) from None


def object_context(tenant: str, key: str) -> StreamContext:
    """What a sealed dataset object is bound to."""
    return StreamContext(tenant, DATASET_JOB, 0, key)


def seal(chunks: Iterable[bytes], sink, dataset_key: DatasetKey, key: str) -> int:
    """Seal the plaintext ``chunks`` into ``sink`` as dataset object ``key``; return the plaintext size."""
    encryptor = StreamEncryptor(sink, context=object_context(dataset_key.tenant, key), wrapper=dataset_key)
    for chunk in chunks:
        encryptor.write(chunk)
    return encryptor.close().plaintext_size


def unseal(sealed: bytes, dataset_key: DatasetKey, key: str, name: str) -> bytearray:
    """Decrypt and authenticate the whole dataset object ``key`` (``name`` is its location, for errors).

    Segments are decrypted straight from views of ``sealed`` into one buffer.
    """
    source = _Views(sealed)
    try:
        decryptor = StreamDecryptor(source, context=object_context(dataset_key.tenant, key), unwrapper=dataset_key)
        plaintext = bytearray(len(sealed) - source.offset)  # the segments' tags make it a little larger than needed
        del plaintext[decryptor.read_into(plaintext) :]
    except IntegrityError as error:
        raise SealedShardError(f"encrypted shard {name}: {error}") from None
    return plaintext


class _Views:
    """A file-like reader that hands out views of bytes already fetched."""

    def __init__(self, data: bytes) -> None:
        self._view, self.offset = memoryview(data), 0

    def read(self, size: int = -1) -> memoryview:
        end = len(self._view) if size < 0 else self.offset + size
        part = self._view[self.offset : end]
        self.offset += len(part)
        return part
