"""Training data: tenant datasets, token shards and the streaming loader.

- :mod:`.corpus`: the in-memory byte corpus and its sampler (``load_corpus``, ``BatchSampler``);
- :mod:`.sources`: dataset URIs (``builtin:pystdlib``, ``file://``, ``s3://``, ``az://``) and their objects;
- :mod:`.shards`: the binary token-shard format; :mod:`.text`: byte-level tokenizing of text;
- :mod:`.sealing`: shards encrypted under the tenant's dataset key;
- :mod:`.loader`: the deterministic, prefetching, resumable ``DataLoader`` and the ``ValidationSet``;
- :mod:`.cli`: ``cantata data prepare|upload``.

How a worker gets a dataset's secrets: the server writes them into the
worker's 0600 config file, the data source's credentials as
``SourceCredentials.to_json()`` and the tenant's dataset key as
``DatasetKey.to_json()``; the worker parses them with ``from_json`` and
passes them to :func:`open_dataset`.
"""

from cantata.trainer.data.corpus import BatchSampler, TextCorpus, load_corpus
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
)
from cantata.trainer.data.loader import Batch, DataEvent, DataLoader, ValidationSet
from cantata.trainer.data.sealing import DatasetKey
from cantata.trainer.data.sources import Dataset, DatasetURI, SourceCredentials, open_dataset
from cantata.trainer.data.text import Utf8Policy

__all__ = [
    "Batch", "BatchSampler", "DataError", "DataEvent", "DataLoader", "Dataset", "DatasetAccessError", "DatasetKey",
    "DatasetNotFoundError", "DatasetPathError", "DatasetURI", "DatasetURIError", "DatasetUnavailableError",
    "SealedShardError", "ShardChecksumError", "ShardError", "ShardHeaderError", "ShardTruncatedError",
    "SourceCredentials", "TextCorpus", "TextEncodingError", "Utf8Policy", "ValidationSet", "load_corpus",
    "open_dataset",
]
