"""A blob store in a local directory.

Each upload goes to a private temporary file under ``<root>/.partial/``, is
fsynced, renamed over its final name (atomic on POSIX) and the directory is
fsynced, so a crash leaves either the old object or the new one. Keys never
resolve outside the root, even through symbolic links. A full disk is a
:class:`StoreFull` naming the store and the file. :meth:`LocalStore.sweep`
removes the partial files of writers that were killed.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cantata.storage.base import (
    DEFAULT_ORPHAN_AGE,
    BlobNotFoundError,
    BlobReader,
    BlobStore,
    BlobUpload,
    InvalidBlobKeyError,
    StoreFull,
    validate_key,
    validate_prefix,
)

PARTIAL_DIR = ".partial"
_FULL = {errno.ENOSPC, errno.EDQUOT}


class LocalStore(BlobStore):
    """Objects stored as files below ``root`` (created with mode 0700 if missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).resolve()
        (self._root / PARTIAL_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)

    @property
    def uri(self) -> str:
        return self._root.as_uri()

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str) -> Path:
        path = self._root / validate_key(key)
        if not Path(os.path.realpath(path)).is_relative_to(self._root):
            raise InvalidBlobKeyError(f"key {key!r} resolves outside the store root")
        return path

    def _start_upload(self, key: str) -> BlobUpload:
        return _LocalUpload(self.uri, self._path(key), self._root / PARTIAL_DIR)

    def sweep(self, older_than: float = DEFAULT_ORPHAN_AGE) -> int:
        """Remove partial files not written to for more than ``older_than`` seconds."""
        cutoff = time.time() - older_than
        removed = 0
        for entry in os.scandir(self._root / PARTIAL_DIR):
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:  # its writer committed or aborted meanwhile
                continue
        return removed

    def get(self, key: str) -> _FileReader:
        try:
            return _FileReader(open(self._path(key), "rb"))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise BlobNotFoundError(f"no object {key!r} in {self.uri}") from None

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        with self.get(key) as reader:
            return os.pread(reader.fileno(), length, offset)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        validate_prefix(prefix)
        start = self._root / prefix.rpartition("/")[0]
        if not Path(os.path.realpath(start)).is_relative_to(self._root):
            raise InvalidBlobKeyError(f"prefix {prefix!r} resolves outside the store root")
        sizes = {}
        for directory, subdirs, files in os.walk(start, onerror=_unlisted):
            relative = Path(directory).relative_to(self._root).as_posix()
            subdirs[:] = [d for d in subdirs if not d.startswith(".")]
            for name in (f for f in files if not f.startswith(".")):
                key = name if relative == "." else f"{relative}/{name}"
                if key.startswith(prefix):
                    try:
                        sizes[key] = os.stat(os.path.join(directory, name)).st_size
                    except FileNotFoundError:  # deleted since the walk listed it
                        continue
        return sizes

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        _fsync_directory(path.parent)


class _FileReader(BlobReader):
    def __init__(self, file) -> None:
        self._file = file

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size)

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> _FileReader:
        return self


class _LocalUpload(BlobUpload):
    def __init__(self, uri: str, destination: Path, partial_dir: Path) -> None:
        self._uri = uri
        self._destination = destination
        with self._space():
            descriptor, temp_name = tempfile.mkstemp(dir=partial_dir, prefix="upload-")
        self._temp = Path(temp_name)
        self._file = os.fdopen(descriptor, "wb")

    @contextmanager
    def _space(self) -> Iterator[None]:
        """Turn a full disk or quota into :class:`StoreFull` naming the store and the object."""
        try:
            yield
        except OSError as error:
            if error.errno in _FULL:
                raise StoreFull(
                    f"store {self._uri} is full: cannot write {self._destination} ({error.strerror})"
                ) from error
            raise

    def write(self, data: bytes | bytearray | memoryview) -> int:
        with self._space():
            return self._file.write(data)

    def commit(self) -> None:
        with self._space():
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._temp, self._destination)
            _fsync_directory(self._destination.parent)

    def abort(self) -> None:
        try:
            self._file.close()
        except OSError as error:  # buffered bytes that no longer fit: they are being discarded anyway
            if error.errno not in _FULL:
                raise
        self._temp.unlink(missing_ok=True)


def _unlisted(error: OSError) -> None:
    """A folder the walk cannot read fails the listing (a checkpoint it hides would look absent); a missing one is empty."""
    if not isinstance(error, FileNotFoundError):
        raise error


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
