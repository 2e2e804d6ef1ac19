"""Copy prepared shards to a blob store, sealed or not: ``cantata data upload``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cantata.storage import BlobStore
from cantata.storage.base import COPY_CHUNK_SIZE
from cantata.trainer.data.errors import DatasetNotFoundError
from cantata.trainer.data.sealing import SEALED_SUFFIX, DatasetKey, seal
from cantata.trainer.data.shards import SHARD_SUFFIX
from cantata.trainer.data.sources import translated_store_errors


def shard_files(directory: Path) -> list[Path]:
    shards = sorted(directory.rglob("*" + SHARD_SUFFIX)) if directory.is_dir() else []
    if not shards:
        raise DatasetNotFoundError(f"{directory} holds no *{SHARD_SUFFIX} shards (run `cantata data prepare`)")
    return shards


def upload_shards(
    directory: Path,
    store: BlobStore,
    *,
    dataset_key: DatasetKey | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> list[str]:
    """Store every shard under ``directory`` by its relative path; seal each one with ``dataset_key`` if given.

    Returns the keys written. A sealed shard is bound to its key without the
    ``.sealed`` suffix, relative to ``store``: read it through the same URI.
    """
    keys = []
    shards = shard_files(directory)
    for index, path in enumerate(shards, start=1):
        key = path.relative_to(directory).as_posix()
        with open(path, "rb") as file, translated_store_errors(f"uploading {path} to {store.uri}"):
            if dataset_key is None:
                store.put(key, file)
            else:
                key += SEALED_SUFFIX
                with store.writer(key) as upload:
                    seal(
                        iter(lambda: file.read(COPY_CHUNK_SIZE), b""),
                        upload,
                        dataset_key,
                        key.removesuffix(SEALED_SUFFIX),
                    )
        keys.append(key)
        progress(f"uploaded {index}/{len(shards)}: {store.uri.rstrip('/')}/{key}")
    return keys
