"""A blob store in a local directory.

Each upload goes to a private temporary file under ``<root>/.partial/``, is
fsynced, renamed over its final name (atomic on POSIX) and the directory is
fsynced, so a crash leaves either the old object or the new one. Keys never
resolve outside the root, even through symbolic links.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cantata.storage.base import (
    BlobNotFoundError,
    BlobReader,
    BlobStore,
    BlobUpload,
    InvalidBlobKeyError,
    validate_key,
    validate_prefix,
)

PARTIAL_DIR = ".partial"


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
        return _LocalUpload(self._path(key), self._root / PARTIAL_DIR)

    def get(self, key: str) -> BlobReader:
        try:
            return _FileReader(open(self._path(key), "rb"))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise BlobNotFoundError(f"no object {key!r} in {self.uri}") from None

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        start = self._root / prefix.rpartition("/")[0]
        if not Path(os.path.realpath(start)).is_relative_to(self._root):
            raise InvalidBlobKeyError(f"prefix {prefix!r} resolves outside the store root")
        keys = []
        for directory, subdirs, files in os.walk(start):
            relative = Path(directory).relative_to(self._root).as_posix()
            subdirs[:] = [d for d in subdirs if not d.startswith(".")]
            for name in (f for f in files if not f.startswith(".")):
                key = name if relative == "." else f"{relative}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

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

    def close(self) -> None:
        self._file.close()


class _LocalUpload(BlobUpload):
    def __init__(self, destination: Path, partial_dir: Path) -> None:
        self._destination = destination
        descriptor, temp_name = tempfile.mkstemp(dir=partial_dir, prefix="upload-")
        self._temp = Path(temp_name)
        self._file = os.fdopen(descriptor, "wb")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._file.write(data)

    def commit(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._temp, self._destination)
        _fsync_directory(self._destination.parent)

    def abort(self) -> None:
        self._file.close()
        self._temp.unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
