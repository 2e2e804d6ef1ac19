"""The store registry: every URI scheme of a blob store, written once, and how each is opened.

A scheme (``file``, ``s3``, ``az``) joins with :func:`register`; :func:`open_store`,
the server's checks, the trainer's data and weights, and the job fields' prefixes
all ask this module, so no other module spells a scheme. A remote scheme is
reached with credentials, which a data source of the same kind may hold
(``s3://SOURCE@bucket/prefix``). This module imports nothing but the standard
library and the stores' interface: a backend and its SDK load when a URI of it
is opened, so the SDK and the job fields may read the table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlparse, urlsplit

from cantata.storage.base import BlobStore, StoreConfigError
from cantata.storage.outage import OutageListener

Opener = Callable[[SplitResult, OutageListener | None, dict[str, Any]], BlobStore]


@dataclass(frozen=True)
class StoreScheme:
    """One kind of blob store, as its URIs name it."""

    name: str  # the URI scheme: ``name://location/prefix``
    open: Opener  # (the split URI, the outage listener, constructor overrides) -> the store
    remote: bool  # reached over the network with credentials (a data source of kind ``name`` may hold them)
    label: str  # the store's kind in metrics labels
    env_prefixes: tuple[str, ...] = ()  # the environment variables its SDK reads on the server's behalf
    # (endpoint, environment) -> the constructor keywords that reach it at an endpoint (None: it has none)
    endpoint: Callable[[str, Mapping[str, str]], dict[str, Any]] | None = None
    # (endpoint, a data source's secrets) -> the constructor keywords that reach it with them (None: local)
    credentials: Callable[[str, Mapping[str, str]], dict[str, Any]] | None = None

    @property
    def prefix(self) -> str:
        return f"{self.name}://"


SCHEMES: dict[str, StoreScheme] = {}
LOCAL = "file"  # the scheme of a directory on this machine


def register(scheme: StoreScheme) -> StoreScheme:
    """Add ``scheme`` to the registry; a name taken already is refused."""
    if scheme.name in SCHEMES:
        raise ValueError(f"store scheme {scheme.name!r} is registered already")
    SCHEMES[scheme.name] = scheme
    return scheme


def scheme_of(uri: str) -> str:
    """The text before ``://`` ("" without one)."""
    head, sep, _ = uri.partition("://")
    return head if sep else ""


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a ``file://`` URI."""
    return uri.startswith(SCHEMES[LOCAL].prefix)


def is_remote(scheme: str) -> bool:
    """Whether ``scheme`` names a registered store reached with credentials."""
    return scheme in SCHEMES and SCHEMES[scheme].remote


def local_directory(uri: str) -> Path | None:
    """The directory a ``file://`` URI names (None for any other)."""
    return Path(unquote(urlparse(uri).path)) if is_local(uri) else None


def store_uri(scheme: str, location: str, prefix: str) -> str:
    """``scheme://location/prefix``."""
    return f"{SCHEMES[scheme].prefix}{location}/{prefix}"


def prefixes() -> tuple[str, ...]:
    """Every registered scheme's ``name://``, local first."""
    return tuple(s.prefix for s in SCHEMES.values())


def written_forms() -> str:
    """The schemes as a message lists them: ``file://, s3:// or az://``."""
    *first, last = prefixes()
    return f"{', '.join(first)} or {last}" if first else last


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
    scheme = SCHEMES.get(parts.scheme)
    if scheme is None:
        raise StoreConfigError(f"unsupported store URI {uri!r}: use {written_forms()}")
    return scheme.open(parts, outages, overrides)


def _backend(module: str, cls: str) -> Opener:
    """An opener that imports ``module`` (and its SDK) only when a URI of it is opened."""

    def open_remote(parts: SplitResult, outages: OutageListener | None, overrides: dict[str, Any]) -> BlobStore:
        store = getattr(importlib.import_module(module), cls)
        return store(parts.netloc, unquote(parts.path), outages=outages, **overrides)

    return open_remote


def _s3_credentials(endpoint: str, secrets: Mapping[str, str]) -> dict[str, Any]:
    """``access_key_id``, ``secret_access_key``, optional ``session_token`` and ``region``."""
    return {
        "endpoint_url": endpoint or None,
        "region_name": secrets.get("region") or "us-east-1",
        "aws_access_key_id": secrets.get("access_key_id"),
        "aws_secret_access_key": secrets.get("secret_access_key"),
        "aws_session_token": secrets.get("session_token") or None,
    }


def _azure_credentials(endpoint: str, secrets: Mapping[str, str]) -> dict[str, Any]:
    """``connection_string``, or ``account_name`` with ``account_key``, or ``sas_token``."""
    if secrets.get("connection_string"):
        return {"connection_string": secrets["connection_string"]}
    if secrets.get("account_key"):
        return {
            "account_url": endpoint,
            "credential": {"account_name": secrets.get("account_name", ""), "account_key": secrets["account_key"]},
        }
    return {"account_url": endpoint, "credential": secrets.get("sas_token")}


def _open_local(parts: SplitResult, outages: OutageListener | None, overrides: dict[str, Any]) -> BlobStore:
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise StoreConfigError(f"file store URI {parts.geturl()!r} must be file:///absolute/path")
    from cantata.storage.local import LocalStore

    return LocalStore(unquote(parts.path), **overrides)


def _s3_endpoint(endpoint: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """An S3-compatible endpoint URL."""
    return {"endpoint_url": endpoint}


def _azure_endpoint(endpoint: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The account URL, with the account key or SAS token from the environment the Azure tools read."""
    credential: object = None
    if environ.get("AZURE_STORAGE_ACCOUNT") and environ.get("AZURE_STORAGE_KEY"):
        credential = {"account_name": environ["AZURE_STORAGE_ACCOUNT"], "account_key": environ["AZURE_STORAGE_KEY"]}
    elif environ.get("AZURE_STORAGE_SAS_TOKEN"):
        credential = environ["AZURE_STORAGE_SAS_TOKEN"]
    return {"account_url": endpoint, "credential": credential}


register(StoreScheme(LOCAL, _open_local, remote=False, label="file"))
register(
    StoreScheme(
        "s3",
        _backend("cantata.storage.s3", "S3Store"),
        remote=True,
        label="s3",
        env_prefixes=("AWS_",),
        endpoint=_s3_endpoint,
        credentials=_s3_credentials,
    )
)
register(
    StoreScheme(
        "az",
        _backend("cantata.storage.azure", "AzureBlobStore"),
        remote=True,
        label="azure",
        env_prefixes=("AZURE_",),
        endpoint=_azure_endpoint,
        credentials=_azure_credentials,
    )
)
