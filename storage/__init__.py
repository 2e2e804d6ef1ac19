"""Blob stores for checkpoints: a local directory, S3 and Azure Blob behind one interface."""

from cantata.storage.base import (
    BlobNotFoundError,
    BlobReader,
    BlobStore,
    BlobUpload,
    InvalidBlobKeyError,
    StoreConfigError,
    StoreError,
    StoreFull,
    StoreNotFound,
    StorePermissionError,
    StoreUnavailableError,
)
from cantata.storage.uri import open_store

__all__ = [
    "BlobNotFoundError",
    "BlobReader",
    "BlobStore",
    "BlobUpload",
    "InvalidBlobKeyError",
    "StoreConfigError",
    "StoreError",
    "StoreFull",
    "StoreNotFound",
    "StorePermissionError",
    "StoreUnavailableError",
    "open_store",
]
