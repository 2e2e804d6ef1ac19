"""Open a blob store from its URI: ``file://``, ``s3://bucket/prefix`` or ``az://container/prefix``."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from cantata.storage.base import BlobStore, StoreConfigError
from cantata.storage.outage import OutageListener


def open_store(uri: str, *, outages: OutageListener | None = None, **overrides: Any) -> BlobStore:
    """Return the store that ``uri`` names; ``overrides`` go to its constructor.

    ``outages`` hears when a remote store stops answering while its retries run, and when it answers
    again (a local directory is not retried: it has no outage to tell).

    ``file:///abs/dir`` is a local directory; ``s3://bucket/prefix`` accepts
    ``endpoint_url``, ``region_name``, ``profile_name`` or ``session``, credentials,
    ``part_size``, ``max_concurrency`` (parts of one upload sent at once) and ``retries``;
    ``az://container/prefix`` accepts ``connection_string``, ``account_url``, ``credential``,
    ``block_size``, ``max_concurrency`` and ``retries``.
    """
    parts = urlsplit(uri)
    if parts.query or parts.fragment:
        raise StoreConfigError(f"store URI {uri!r} must not have a query or fragment")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise StoreConfigError(f"file store URI {uri!r} must be file:///absolute/path")
        from cantata.storage.local import LocalStore

        return LocalStore(unquote(parts.path), **overrides)
    if parts.scheme == "s3":
        from cantata.storage.s3 import S3Store

        return S3Store(parts.netloc, unquote(parts.path), outages=outages, **overrides)
    if parts.scheme == "az":
        from cantata.storage.azure import AzureBlobStore

        return AzureBlobStore(parts.netloc, unquote(parts.path), outages=outages, **overrides)
    raise StoreConfigError(f"unsupported store URI {uri!r}: use file://, s3:// or az://")
