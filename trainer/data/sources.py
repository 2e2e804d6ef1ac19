"""Where a dataset's objects come from, and how each becomes tokens.

Dataset URIs (the ``Job.dataset`` field):

- ``builtin:pystdlib``: the ``.py`` sources of the running interpreter's standard library;
- ``file:///abs/dir``: files under a directory inside one of the allowed roots;
- ``s3://[source@]bucket/prefix`` and ``az://[source@]container/prefix``: objects
  under a prefix, read with the credentials of the tenant's registered data
  source named in the user part (a worker receives them as
  :class:`SourceCredentials`); without a source name the store's ambient
  configuration applies (the tenant's own machine).

Objects are classified by suffix: ``*.tok`` token shards
(:mod:`~cantata.trainer.data.shards`), ``*.tok.sealed`` encrypted shards
(:mod:`~cantata.trainer.data.sealing`), ``*.txt`` and ``*.jsonl`` text
(:mod:`~cantata.trainer.data.text`); anything else is ignored. Local files are
opened without following symbolic links and every path component is checked
again at read time, whatever the server checked at submit.
"""

from __future__ import annotations

import enum
import json
import os
import stat
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

import numpy as np

from cantata.proto.datasource_rules import credentials_problem
from cantata.storage import (
    BlobNotFoundError,
    BlobStore,
    StoreConfigError,
    StoreError,
    StoreNotFound,
    StoreUnavailableError,
    open_store,
)
from cantata.storage import uri as stores
from cantata.trainer.data.errors import (
    DataError,
    DatasetAccessError,
    DatasetNotFoundError,
    DatasetPathError,
    DatasetUnavailableError,
    DatasetURIError,
)
from cantata.trainer.data.sealing import SEALED_SUFFIX, DatasetKey, unseal
from cantata.trainer.data.shards import HEADER_SIZE as SHARD_HEADER_SIZE
from cantata.trainer.data.shards import MIN_TOKEN_WIDTH, SHARD_SUFFIX, open_shard
from cantata.trainer.data.text import TEXT_SUFFIXES, Utf8Policy, tokenize_object
from cantata.trainer.data.tokenizer import Vocabulary

BUILTIN_PYSTDLIB = "builtin:pystdlib"
_ACCESS_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "AuthenticationFailed",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
}


class ObjectKind(enum.Enum):
    SHARD = "shard"
    SEALED_SHARD = "sealed-shard"
    TEXT = "text"


@dataclass(frozen=True)
class DatasetURI:
    """A parsed ``Job.dataset`` value."""

    scheme: str  # "builtin" or a store scheme (cantata.storage.uri)
    location: str  # bucket, container or absolute directory
    prefix: str
    source: str  # the registered data source named in the URI ("" if none)

    @classmethod
    def parse(cls, text: str) -> DatasetURI:
        if text == BUILTIN_PYSTDLIB:
            return cls("builtin", sysconfig.get_paths()["stdlib"], "", "")
        parts = urlsplit(text)
        if parts.query or parts.fragment:
            raise DatasetURIError(f"dataset {text!r} must not have a query or fragment")
        if parts.scheme == stores.LOCAL:
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                raise DatasetURIError(f"dataset {text!r} must be file:///absolute/path")
            return cls(stores.LOCAL, unquote(parts.path), "", "")
        if stores.is_remote(parts.scheme):
            source, _, location = parts.netloc.rpartition("@")
            if not location:
                raise DatasetURIError(f"dataset {text!r} names no bucket or container")
            return cls(parts.scheme, location, unquote(parts.path).strip("/"), unquote(source))
        raise DatasetURIError(f"unsupported dataset {text!r}: use {BUILTIN_PYSTDLIB}, file://, s3:// or az://")

    @property
    def store_uri(self) -> str:
        return stores.store_uri(self.scheme, self.location, self.prefix)


@dataclass(frozen=True)
class SourceCredentials:
    """A data source's connection, as the server hands it to a job's workers.

    JSON: ``{"name": ..., "kind": "s3"|"az", "endpoint": ..., "secrets": {...}}``, checked by
    :func:`cantata.proto.datasource_rules.credentials_problem`; the store registry
    (:mod:`cantata.storage.uri`) turns a kind's secrets into its store's keywords.
    """

    name: str
    kind: str
    endpoint: str
    secrets: dict[str, str] = field(repr=False)

    @classmethod
    def from_json(cls, text: str) -> SourceCredentials:
        try:
            document = json.loads(text)
        except ValueError as error:
            raise DataError(f"invalid data source credentials document: {error}") from None
        return cls.from_dict(document)

    @classmethod
    def from_dict(cls, document: Any) -> SourceCredentials:
        try:
            secrets = {str(k): str(v) for k, v in document["secrets"].items()}
            credentials = cls(str(document["name"]), str(document["kind"]), str(document.get("endpoint", "")), secrets)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise DataError(f"invalid data source credentials document: {error}") from None
        refused = credentials_problem(credentials.kind, credentials.secrets)
        if refused:
            raise DataError(f"data source {credentials.name!r}: {refused}")
        return credentials

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "kind": self.kind, "endpoint": self.endpoint, "secrets": self.secrets})

    def store_options(self) -> dict[str, Any]:
        """Keyword overrides for :func:`cantata.storage.open_store`."""
        credentials = stores.SCHEMES[self.kind].credentials
        assert credentials is not None  # from_dict admits kinds with credentials only
        return credentials(self.endpoint, self.secrets)


@dataclass(frozen=True)
class DataObject:
    key: str
    kind: ObjectKind
    size: int  # bytes, as listed (before decryption and tokenization)


class ObjectSource(Protocol):
    """A flat listing of objects that can be read whole."""

    uri: str

    def sizes(self) -> dict[str, int]: ...

    def read(self, key: str) -> bytes: ...


class LocalDirectory:
    """Regular files under ``root``, never through a symbolic link below it (nor above it, unless trusted)."""

    def __init__(
        self, root: Path, uri: str, skip_dirs: frozenset[str] = frozenset(), *, trusted_root: bool = False
    ) -> None:
        self.root, self.uri, self._skip_dirs = root, uri, skip_dirs
        with _denied_as_access_error(uri, root):
            if not trusted_root:
                _refuse_links(root, Path(root.anchor), uri)
            try:
                is_dir = stat.S_ISDIR(root.stat().st_mode)
            except PermissionError:
                raise  # a DatasetAccessError, not a missing directory
            except OSError:
                is_dir = False
        if not is_dir:
            raise DatasetNotFoundError(f"dataset {uri}: directory {root} does not exist")

    def sizes(self) -> dict[str, int]:
        sizes = {}

        def unreadable(error: OSError) -> None:
            if isinstance(error, PermissionError):
                raise error  # a DatasetAccessError naming it
            raise DatasetAccessError(f"dataset {self.uri}: cannot list {error.filename} ({error.strerror})")

        with _denied_as_access_error(self.uri, self.root):
            for directory, subdirs, files in os.walk(self.root, onerror=unreadable):
                base = Path(directory)
                for name in subdirs + files:
                    if (base / name).is_symlink():
                        raise DatasetPathError(f"dataset {self.uri}: {base / name} is a symbolic link")
                subdirs[:] = sorted(d for d in subdirs if d not in self._skip_dirs and not d.startswith("."))
                for name in (f for f in files if not f.startswith(".")):
                    sizes[(base / name).relative_to(self.root).as_posix()] = (base / name).lstat().st_size
        return sizes

    def read(self, key: str) -> bytes:
        with self._open(key) as file:
            return file.read()

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``offset`` on."""
        with self._open(key) as file:
            return os.pread(file.fileno(), length, offset)

    def _open(self, key: str) -> BinaryIO:
        path = self.root / key
        with _denied_as_access_error(self.uri, path):
            _refuse_links(path, self.root, self.uri)
            try:
                descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except PermissionError:
                raise  # a DatasetAccessError
            except OSError as error:
                raise DatasetPathError(f"dataset {self.uri}: cannot open {path} ({error.strerror})") from None
        file = os.fdopen(descriptor, "rb")
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            file.close()
            raise DatasetPathError(f"dataset {self.uri}: {path} is not a regular file")
        return file


class StoreObjects:
    """Objects in a blob store, with its errors mapped to dataset errors."""

    def __init__(self, store: BlobStore) -> None:
        self.store, self.uri = store, store.uri

    def sizes(self) -> dict[str, int]:
        with translated_store_errors(f"listing {self.uri}"):
            return self.store.sizes()

    def read(self, key: str) -> bytes:
        with translated_store_errors(f"reading {self.uri}{key}"):
            return self.store.get_bytes(key)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``offset`` on (a ranged read: nothing else is fetched)."""
        with translated_store_errors(f"reading {self.uri}{key}"):
            return self.store.get_range(key, offset, length)


@contextmanager
def translated_store_errors(action: str) -> Iterator[None]:
    """Map blob-store errors to dataset errors whose message names ``action``'s object."""
    try:
        yield
    except BlobNotFoundError as error:
        raise DatasetNotFoundError(f"{action}: {error}") from error
    except StoreUnavailableError as error:
        raise DatasetUnavailableError(f"{action}: {error}") from error
    except StoreNotFound as error:
        code = _service_code(error.__cause__)
        raise DatasetNotFoundError(f"{action}: the bucket or container does not exist ({code})") from error
    except StoreConfigError as error:
        raise DatasetNotFoundError(f"{action}: {error}") from error
    except StoreError as error:
        code = _service_code(error.__cause__)
        if code in _ACCESS_CODES:
            raise DatasetAccessError(f"{action}: the store refused the credentials ({code})") from error
        raise DataError(f"{action}: {error}") from error


def _service_code(cause: BaseException | None) -> str:
    """The error code an S3 or Azure error carries, if any."""
    response = getattr(cause, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    code = getattr(cause, "error_code", None)
    if code:
        return str(getattr(code, "value", code))
    return "AuthenticationFailed" if getattr(cause, "status_code", None) == 403 else ""


@contextmanager
def _denied_as_access_error(uri: str, path: Path) -> Iterator[None]:
    """Turn the system's refusal to let this worker reach ``path`` (or a file under it) into a :class:`DatasetAccessError`."""
    try:
        yield
    except PermissionError as error:
        if isinstance(error, DataError):
            raise
        denied = error.filename or path
        raise DatasetAccessError(
            f"dataset {uri}: this job's workers may not read {denied} (permission denied): as root the server runs "
            "them as a uid of their own with their tenant's gid (docs/security.md, Tenants' files)"
        ) from None


def _refuse_links(path: Path, top: Path, uri: str) -> None:
    """Raise if ``path`` or any directory between ``top`` and it is a symbolic link."""
    probe = path
    while True:
        if probe.is_symlink():
            raise DatasetPathError(f"dataset {uri}: {probe} is a symbolic link")
        if probe == top or probe == probe.parent:
            return
        probe = probe.parent


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


class Dataset:
    """A dataset's objects, sorted by key, and the means to turn each into tokens."""

    def __init__(
        self,
        uri: str,
        objects: ObjectSource,
        *,
        text_suffixes: tuple[str, ...],
        dataset_key: DatasetKey | None,
        utf8_policy: Utf8Policy,
        vocabulary: Vocabulary | None = None,
    ) -> None:
        self.uri = uri
        self._vocabulary = vocabulary
        self._objects = objects
        self._text_suffixes = text_suffixes
        self._dataset_key = dataset_key
        self._utf8_policy = utf8_policy
        listed = objects.sizes()
        self.objects = [obj for obj in (self._classify(key, listed[key]) for key in sorted(listed)) if obj is not None]
        if not self.objects:
            suffixes = ", ".join(
                ("*" + SHARD_SUFFIX, "*" + SHARD_SUFFIX + SEALED_SUFFIX, *("*" + s for s in text_suffixes))
            )
            raise DatasetNotFoundError(f"dataset {uri}: no data objects ({suffixes}) under {objects.uri}")
        if dataset_key is None and any(obj.kind is ObjectKind.SEALED_SHARD for obj in self.objects):
            raise DataError(f"dataset {uri} holds encrypted shards but no dataset key was given")

    def _classify(self, key: str, size: int) -> DataObject | None:
        if key.endswith(SHARD_SUFFIX + SEALED_SUFFIX):
            return DataObject(key, ObjectKind.SEALED_SHARD, size)
        if key.endswith(SHARD_SUFFIX):
            return DataObject(key, ObjectKind.SHARD, size)
        if key.endswith(self._text_suffixes):
            return DataObject(key, ObjectKind.TEXT, size)
        return None

    def max_tokens(self, obj: DataObject) -> int:
        """An upper bound on ``obj``'s tokens from its listed size alone (exact for an unsealed version-1 ``uint16`` shard).

        A shard stores at least two bytes a token after its header (a sealed one adds
        its own overhead); text yields at most one token a byte.
        """
        if obj.kind is ObjectKind.TEXT:
            return obj.size
        return max(0, obj.size - SHARD_HEADER_SIZE) // MIN_TOKEN_WIDTH

    def location(self, obj: DataObject) -> str:
        return f"{self._objects.uri.rstrip('/')}/{obj.key}"

    def tokens(self, obj: DataObject, warn: Callable[[str], None]) -> np.ndarray:
        """Fetch one object and return its verified tokens (checked against the vocabulary, if one was given)."""
        data = self._objects.read(obj.key)
        name = self.location(obj)
        if obj.kind is ObjectKind.TEXT:
            tokens = tokenize_object(data, name, self._utf8_policy, warn)
            if self._vocabulary is not None:
                self._vocabulary.check_text(tokens, name)
            return tokens
        if obj.kind is ObjectKind.SEALED_SHARD:
            assert self._dataset_key is not None
            header, tokens = open_shard(
                unseal(data, self._dataset_key, obj.key.removesuffix(SEALED_SUFFIX), name), name
            )
        else:
            header, tokens = open_shard(data, name)
        if self._vocabulary is not None:
            self._vocabulary.check_shard(header, tokens, name)
        return tokens


def source_store_options(parsed: DatasetURI, credentials: SourceCredentials | None, what: str) -> dict[str, Any]:
    """The :func:`open_store` options of the data source ``parsed`` names (none without one), or a ``DataError``.

    ``what`` (``dataset URI``) names the field in the message.
    """
    if not parsed.source:
        return {}
    if credentials is None or credentials.name != parsed.source:
        raise DataError(f"{what} names data source {parsed.source!r}, whose credentials were not given")
    if credentials.kind != parsed.scheme:
        raise DataError(f"data source {parsed.source!r} is {credentials.kind}, not {parsed.scheme}")
    return credentials.store_options()


def open_dataset(
    uri: str,
    *,
    allowed_roots: Sequence[Path] = (),
    credentials: SourceCredentials | None = None,
    dataset_key: DatasetKey | None = None,
    utf8_policy: Utf8Policy = Utf8Policy.SKIP,
    vocabulary: Vocabulary | None = None,
    **store_options: Any,
) -> Dataset:
    """Resolve ``uri`` and list its objects (raising a :class:`DataError` naming what is wrong)."""
    parsed = DatasetURI.parse(uri)
    if parsed.scheme == "builtin":
        root = Path(parsed.location)
        directory = LocalDirectory(root, uri, frozenset({"site-packages"}), trusted_root=True)
        return Dataset(
            uri,
            directory,
            text_suffixes=(".py",),
            dataset_key=dataset_key,
            utf8_policy=utf8_policy,
            vocabulary=vocabulary,
        )
    if parsed.scheme == stores.LOCAL:
        path = Path(os.path.abspath(parsed.location))
        if ".." in Path(parsed.location).parts or not _within(path, [Path(r) for r in allowed_roots]):
            raise DatasetPathError(f"dataset {uri}: {path} is outside the allowed roots")
        return Dataset(
            uri,
            LocalDirectory(path, uri),
            text_suffixes=TEXT_SUFFIXES,
            dataset_key=dataset_key,
            utf8_policy=utf8_policy,
            vocabulary=vocabulary,
        )
    with translated_store_errors(f"opening dataset {uri}"):
        options = {**source_store_options(parsed, credentials, f"dataset {uri}"), **store_options}
        store = open_store(parsed.store_uri, **options)
    return Dataset(
        uri,
        StoreObjects(store),
        text_suffixes=TEXT_SUFFIXES,
        dataset_key=dataset_key,
        utf8_policy=utf8_policy,
        vocabulary=vocabulary,
    )
