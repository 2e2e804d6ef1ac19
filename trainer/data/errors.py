"""Typed errors of tenant datasets; every message names the object at fault."""

from __future__ import annotations


class DataError(ValueError):
    """A dataset could not be read or prepared."""


class DatasetURIError(DataError):
    """A dataset URI is malformed or uses an unsupported scheme."""


class DatasetPathError(DataError):
    """A ``file://`` dataset lies outside the allowed roots or goes through a symbolic link."""


class DatasetNotFoundError(DataError, LookupError):
    """The bucket, container or directory does not exist, or the prefix holds no data objects."""


class DatasetAccessError(DataError, PermissionError):
    """The store refused the credentials."""


class DatasetUnavailableError(DataError):
    """The store could not be reached, or kept failing."""


class ShardError(DataError):
    """A token shard is not valid."""


class ShardHeaderError(ShardError):
    """A shard's header is malformed (magic, version, dtype or header checksum)."""


class ShardChecksumError(ShardError):
    """A shard's tokens do not match the checksum in its header."""


class ShardTruncatedError(ShardError):
    """A shard ends before its header's token count, or has bytes after it."""


class SealedShardError(ShardError):
    """An encrypted shard failed to decrypt: wrong key, tampered with, or moved."""


class TextEncodingError(DataError):
    """A text file is not valid UTF-8 (or a JSON Lines record has no ``text`` string)."""


class VocabularyError(DataError):
    """A dataset's tokens do not fit the job: an id past the model's vocabulary, or another tokenizer's shard."""


class TokenizerError(DataError):
    """A tokenizer.json that the ``tokenizers`` library cannot load."""
