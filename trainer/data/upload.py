"""Copy prepared shards to a blob store, sealed or not: ``cantata data upload``.

Shards go up ``jobs`` at a time, each through its own streaming upload (whose
parts the store may also send concurrently: ``max_concurrency``); every byte
read from a shard file is counted through ``on_bytes``, so a caller can draw
one progress bar for the whole upload.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cantata.storage import BlobStore
from cantata.storage.base import COPY_CHUNK_SIZE
from cantata.trainer.data.errors import DatasetNotFoundError
from cantata.trainer.data.sealing import SEALED_SUFFIX, DatasetKey, seal
from cantata.trainer.data.shards import SHARD_SUFFIX
from cantata.trainer.data.sources import translated_store_errors

DEFAULT_JOBS = 4


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
    jobs: int = DEFAULT_JOBS,
    on_bytes: Callable[[int], None] = lambda count: None,
) -> list[str]:
    """Store every shard under ``directory`` by its relative path; seal each one with ``dataset_key`` if given.

    Returns the keys written, in shard order. ``jobs`` shards are uploaded at
    once; the first failure is raised once the uploads in flight have ended
    (each of them commits whole or aborts). A sealed shard is bound to its key
    without the ``.sealed`` suffix, relative to ``store``: read it through the same URI.
    """
    if jobs < 1:
        raise ValueError("jobs must be at least 1")
    shards = shard_files(directory)
    lock = threading.Lock()

    def counted(path: Path) -> Iterator[bytes]:
        with open(path, "rb") as file:
            while chunk := file.read(COPY_CHUNK_SIZE):
                with lock:
                    on_bytes(len(chunk))
                yield chunk

    def upload(path: Path) -> str:
        key = path.relative_to(directory).as_posix()
        with translated_store_errors(f"uploading {path} to {store.uri}"):
            if dataset_key is None:
                store.put(key, counted(path))
                return key
            with store.writer(key + SEALED_SUFFIX) as sink:
                seal(counted(path), sink, dataset_key, key)
            return key + SEALED_SUFFIX

    with ThreadPoolExecutor(min(jobs, len(shards)), thread_name_prefix="upload") as pool:
        futures = [pool.submit(upload, path) for path in shards]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
