"""Training data: tenant datasets, token shards and the streaming loader.

- :mod:`.feed`: what a worker trains on (``open_feed``), over either of the two below;
- :mod:`.corpus`: the built-in in-memory corpus and its sampler (``load_builtin_corpus``, ``BatchSampler``);
- :mod:`.sources`: dataset URIs (``builtin:pystdlib``, ``file://``, ``s3://``, ``az://``) and their objects;
- :mod:`.shards`: the binary token-shard format; :mod:`.text`: byte-level tokenizing of text;
- :mod:`.sealing`: shards encrypted under the tenant's dataset key;
- :mod:`.loader`: the deterministic, prefetching, resumable ``DataLoader`` and the ``ValidationSet``
  that stream tenant datasets;
- :mod:`.cli`: ``cantata data prepare|upload``.

How a worker gets a dataset's secrets: the server writes them into the
worker's 0600 config file, the data source's credentials as
``SourceCredentials.to_json()`` and the tenant's dataset key as
``DatasetKey.to_json()``; the worker parses them into a
:class:`DatasetAccess` for :func:`open_feed`.

Names are imported from their submodules on first use, so that the ``data``
CLI plugin builds its parser without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cantata.trainer.data.batch import Batch
    from cantata.trainer.data.corpus import BatchSampler, TextCorpus, load_builtin_corpus
    from cantata.trainer.data.errors import (
        DataError,
        DatasetAccessError,
        DatasetNotFoundError,
        DatasetPathError,
        DatasetUnavailableError,
        DatasetURIError,
        SealedShardError,
        ShardChecksumError,
        ShardError,
        ShardHeaderError,
        ShardTruncatedError,
        TextEncodingError,
        TokenizerError,
        VocabularyError,
    )
    from cantata.trainer.data.feed import DatasetAccess, Feed, open_feed
    from cantata.trainer.data.loader import DataEvent, DataLoader, ValidationSet
    from cantata.trainer.data.sealing import DatasetKey
    from cantata.trainer.data.sources import Dataset, DatasetURI, SourceCredentials, open_dataset
    from cantata.trainer.data.text import Utf8Policy
    from cantata.trainer.data.tokenizer import TextTokenizer, Vocabulary

_HOMES = {
    "Batch": "batch",
    "BatchSampler": "corpus",
    "TextCorpus": "corpus",
    "load_builtin_corpus": "corpus",
    "DataError": "errors",
    "DatasetAccessError": "errors",
    "DatasetNotFoundError": "errors",
    "DatasetPathError": "errors",
    "DatasetURIError": "errors",
    "DatasetUnavailableError": "errors",
    "SealedShardError": "errors",
    "ShardChecksumError": "errors",
    "ShardError": "errors",
    "ShardHeaderError": "errors",
    "ShardTruncatedError": "errors",
    "TextEncodingError": "errors",
    "TokenizerError": "errors",
    "VocabularyError": "errors",
    "DatasetAccess": "feed",
    "Feed": "feed",
    "open_feed": "feed",
    "DataEvent": "loader",
    "DataLoader": "loader",
    "ValidationSet": "loader",
    "DatasetKey": "sealing",
    "Dataset": "sources",
    "DatasetURI": "sources",
    "SourceCredentials": "sources",
    "open_dataset": "sources",
    "Utf8Policy": "text",
    "TextTokenizer": "tokenizer",
    "Vocabulary": "tokenizer",
}

__all__ = [
    "Batch",
    "BatchSampler",
    "DataError",
    "DataEvent",
    "DataLoader",
    "Dataset",
    "DatasetAccess",
    "DatasetAccessError",
    "DatasetKey",
    "DatasetNotFoundError",
    "DatasetPathError",
    "DatasetURI",
    "DatasetURIError",
    "DatasetUnavailableError",
    "Feed",
    "SealedShardError",
    "ShardChecksumError",
    "ShardError",
    "ShardHeaderError",
    "ShardTruncatedError",
    "SourceCredentials",
    "TextCorpus",
    "TextEncodingError",
    "TextTokenizer",
    "TokenizerError",
    "Utf8Policy",
    "ValidationSet",
    "Vocabulary",
    "VocabularyError",
    "load_builtin_corpus",
    "open_dataset",
    "open_feed",
]


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """The public name ``name``, imported from its submodule."""
        try:
            home = _HOMES[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value
        return value
