"""Encrypted, authenticated checkpoints in a blob store.

A checkpoint of ``(tenant, job, step)`` is a set of sealed shard objects (the
model, each rank's optimizer state, data-loader and RNG state... each a dict
of tensors or raw bytes) plus a sealed manifest listing every shard's kind,
sizes and sealed digest, written last::

    <tenant>/<job>/checkpoints/<step:012d>/<shard>.sealed
    <tenant>/<job>/checkpoints/<step:012d>/MANIFEST.sealed

Every object uses :mod:`cantata.security.stream_aead` with a context naming
its tenant, job, step and object, so an object copied to another place is
refused. A worker that does not take part in the commit may seal small state
of its own beside a checkpoint (:func:`read_unlisted_shard` reads it back):
its context still binds it to its place, but no manifest vouches for it, so
its reader must cope with its absence. The manifest is authenticated by the
same AEAD under the job's key: only a holder of the job key can make one. A
checkpoint whose manifest is absent or invalid does not exist, so a save that
dies midway leaves the previous checkpoint as the newest.

Loading verifies the manifest, then decrypts every shard, checking each
segment's tag and finally its size and digest against the manifest, and only
then deserialises anything, with torch's weights-only unpickler (no
arbitrary pickle); the loaded tensors are views of the one buffer each shard
was decrypted into, not copies. Decrypted state stays in memory: it is never
written to disk or to the store.

Keys: saving takes a :class:`~cantata.security.keys.JobKey` (it wraps each
object's fresh data key); reading takes anything that unwraps, normally the
worker's :class:`~cantata.security.keys.JobKeys` (see that module for how the
server hands them to a worker)::

    # server, when launching a worker: only this job's derived keys leave it
    config["checkpoint_keys"] = keyring.job_keys(tenant, job_id).to_json()  # 0600 file
    # worker
    keys = JobKeys.from_json(config["checkpoint_keys"])
    store = open_store(job.checkpoint_store)
    save_checkpoint(store, tenant=t, job_id=j, step=s, shards=shards, kek=keys.current, keep_last=3)
    info = latest_checkpoint(store, tenant=t, job_id=j, keys=keys)
    state = load_checkpoint(store, tenant=t, job_id=j, step=info.step, keys=keys)
"""

from __future__ import annotations

import io
import json
import logging
import mmap
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import IO, Any, cast

from cantata.security.keys import JobKeys, envelope_key_version
from cantata.security.stream_aead import (
    DEFAULT_SEGMENT_SIZE,
    BufferTooSmallError,
    ContextMismatchError,
    IntegrityError,
    KeyUnwrapper,
    KeyWrapper,
    StreamContext,
    StreamDecryptor,
    StreamEncryptor,
    StreamHeader,
    UnsupportedFormatError,
    rewrap_header,
)
from cantata.storage.base import COPY_CHUNK_SIZE, BlobNotFoundError, BlobStore

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST"
SEALED_SUFFIX = ".sealed"
MANIFEST_FORMAT = 1
KIND_TORCH = "torch"
KIND_BYTES = "bytes"
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+; Python 3.11 does not name it
SHARDED_PART = "train"  # a mesh job's sharded model and optimizer: objects ``train.RANK`` and ``train.metadata``
_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}")
_STEP_DIGITS = 12

State = Mapping[str, Any] | bytes


class InvalidCheckpointError(ValueError):
    """A save was asked with an invalid tenant, job, step or shard name."""


class CheckpointNotFoundError(LookupError):
    """No checkpoint with a manifest exists at that step."""


class ManifestError(IntegrityError):
    """The manifest decrypted but its contents are malformed or misplaced."""


class MissingShardError(IntegrityError):
    """A shard listed in the manifest is not in the store."""


class ShardMismatchError(IntegrityError):
    """A shard's size or sealed digest differs from what the manifest records."""


@dataclass(frozen=True)
class ShardInfo:
    """What the manifest records about one shard."""

    name: str
    kind: str
    plaintext_size: int
    sealed_size: int
    sealed_digest: str


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint whose manifest has been verified."""

    tenant: str
    job_id: str
    step: int
    created_at: str
    shards: tuple[ShardInfo, ...]

    @property
    def plaintext_size(self) -> int:
        return sum(shard.plaintext_size for shard in self.shards)

    @property
    def sealed_size(self) -> int:
        return sum(shard.sealed_size for shard in self.shards)


def checkpoints_prefix(tenant: str, job_id: str) -> str:
    """The store prefix under which a job's checkpoints live."""
    return f"{_checked_name(tenant, 'tenant')}/{_checked_name(job_id, 'job id')}/checkpoints/"


def _step_prefix(tenant: str, job_id: str, step: int) -> str:
    return f"{checkpoints_prefix(tenant, job_id)}{step:0{_STEP_DIGITS}d}/"


def object_key(tenant: str, job_id: str, step: int, name: str) -> str:
    """The store key of a checkpoint's shard (or ``MANIFEST``) object."""
    return f"{_step_prefix(tenant, job_id, step)}{name}{SEALED_SUFFIX}"


def _checked_name(name: str, what: str) -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidCheckpointError(f"invalid {what} {name!r}")
    return name


def save_checkpoint(
    store: BlobStore,
    *,
    tenant: str,
    job_id: str,
    step: int,
    shards: Mapping[str, State],
    kek: KeyWrapper,
    keep_last: int | None = None,
    segment_size: int = DEFAULT_SEGMENT_SIZE,
) -> CheckpointInfo:
    """Seal ``shards`` as the checkpoint at ``step``; then keep only the newest ``keep_last``.

    Shards are streamed to the store one after another, the manifest last. If
    anything fails the exception propagates and no checkpoint exists at
    ``step``. (When ranks write their own shards, one calls
    :func:`begin_checkpoint`, each rank :func:`write_shard`, and then one
    :func:`commit_checkpoint` with all the results.)
    """
    if not shards:
        raise InvalidCheckpointError("a checkpoint needs at least one shard")
    begin_checkpoint(store, tenant=tenant, job_id=job_id, step=step)
    written = [
        write_shard(
            store,
            tenant=tenant,
            job_id=job_id,
            step=step,
            name=name,
            state=shards[name],
            kek=kek,
            segment_size=segment_size,
        )
        for name in sorted(shards)
    ]
    return commit_checkpoint(
        store, tenant=tenant, job_id=job_id, step=step, shards=written, kek=kek, keep_last=keep_last
    )


def begin_checkpoint(store: BlobStore, *, tenant: str, job_id: str, step: int) -> None:
    """Remove any manifest at ``step``, so no checkpoint exists there while its shards are rewritten."""
    store.delete(object_key(tenant, job_id, _checked_step(step), MANIFEST))


def write_shard(
    store: BlobStore,
    *,
    tenant: str,
    job_id: str,
    step: int,
    name: str,
    state: State,
    kek: KeyWrapper,
    segment_size: int = DEFAULT_SEGMENT_SIZE,
) -> ShardInfo:
    """Seal one shard (a dict of tensors, or bytes) of the checkpoint at ``step``."""
    if isinstance(state, (bytes, bytearray, memoryview)):
        return write_shard_parts(
            store, tenant=tenant, job_id=job_id, step=step, name=name, parts=[state], kek=kek, segment_size=segment_size
        )
    return _seal(store, tenant, job_id, step, name, kek, segment_size, KIND_TORCH, lambda out: _torch_save(state, out))


def write_shard_parts(
    store: BlobStore,
    *,
    tenant: str,
    job_id: str,
    step: int,
    name: str,
    parts: Iterable[bytes | bytearray | memoryview],
    kek: KeyWrapper,
    segment_size: int = DEFAULT_SEGMENT_SIZE,
) -> ShardInfo:
    """Seal the concatenation of ``parts`` as one bytes shard, streamed (a rank's sharded-checkpoint object)."""

    def write(out: StreamEncryptor) -> None:
        for part in parts:
            out.write(part)

    return _seal(store, tenant, job_id, step, name, kek, segment_size, KIND_BYTES, write)


def _seal(
    store: BlobStore,
    tenant: str,
    job_id: str,
    step: int,
    name: str,
    kek: KeyWrapper,
    segment_size: int,
    kind: str,
    write: Callable[[StreamEncryptor], None],
) -> ShardInfo:
    """Stream what ``write`` writes, sealed, into shard ``name``'s object of the checkpoint at ``step``."""
    if _checked_name(name, "shard name") == MANIFEST:
        raise InvalidCheckpointError(f"{MANIFEST!r} is reserved")
    context = StreamContext(tenant, job_id, step, name)
    with store.writer(object_key(tenant, job_id, _checked_step(step), name)) as upload:
        encryptor = StreamEncryptor(upload, context=context, wrapper=kek, segment_size=segment_size)
        write(encryptor)
        summary = encryptor.close()
    return ShardInfo(name, kind, summary.plaintext_size, summary.sealed_size, summary.sealed_digest)


def commit_checkpoint(
    store: BlobStore,
    *,
    tenant: str,
    job_id: str,
    step: int,
    shards: list[ShardInfo],
    kek: KeyWrapper,
    keep_last: int | None = None,
) -> CheckpointInfo:
    """Write the manifest that makes the shards written at ``step`` a checkpoint; then prune."""
    names = [shard.name for shard in shards]
    if not shards or len(set(names)) != len(names):
        raise InvalidCheckpointError(f"a checkpoint needs distinct shards, got {names}")
    if keep_last is not None and keep_last < 1:
        raise InvalidCheckpointError("keep_last must be at least 1")
    info = CheckpointInfo(
        tenant, job_id, _checked_step(step), datetime.now(UTC).isoformat(), tuple(sorted(shards, key=lambda s: s.name))
    )
    manifest = json.dumps({"format": MANIFEST_FORMAT, **asdict(info)}).encode()
    with store.writer(object_key(tenant, job_id, step, MANIFEST)) as upload:
        encryptor = StreamEncryptor(upload, context=StreamContext(tenant, job_id, step, MANIFEST), wrapper=kek)
        encryptor.write(manifest)
        encryptor.close()
    if keep_last is not None:
        prune_checkpoints(store, tenant=tenant, job_id=job_id, keep_last=keep_last)
    return info


def _step_of(folder: str) -> int | None:
    """The step a checkpoint folder name spells in its one canonical form (12 ASCII digits), else None."""
    if len(folder) == _STEP_DIGITS and folder.isascii() and folder.isdigit():
        return int(folder)
    return None


def _checked_step(step: int) -> int:
    if not isinstance(step, int) or not 0 <= step < 10**_STEP_DIGITS:
        raise InvalidCheckpointError(f"invalid step {step!r}")
    return step


class _FailureRecordingSink:
    """Remembers the first error its sink raised (``torch.save`` masks it with its own)."""

    def __init__(self, sink: StreamEncryptor) -> None:
        self._sink = sink
        self.failure: Exception | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._sink.write(data)
        except Exception as error:
            self.failure = error
            raise

    def flush(self) -> None:
        self._sink.flush()


def _torch_save(state: Mapping[str, Any], sink: StreamEncryptor) -> None:
    recording = _FailureRecordingSink(sink)
    try:
        import torch  # here, not at the top: the server lists and streams checkpoints without torch

        torch.save(state, cast("IO[bytes]", recording))  # torch only calls write and flush
    except Exception:
        if recording.failure is not None:
            raise recording.failure from None
        raise


def read_manifest(store: BlobStore, *, tenant: str, job_id: str, step: int, keys: KeyUnwrapper) -> CheckpointInfo:
    """Verify and return the manifest of the checkpoint at ``step``."""
    try:
        reader = store.get(object_key(tenant, job_id, step, MANIFEST))
    except BlobNotFoundError:
        raise CheckpointNotFoundError(f"no checkpoint of {tenant}/{job_id} at step {step}") from None
    with reader:
        plaintext = StreamDecryptor(
            reader, context=StreamContext(tenant, job_id, step, MANIFEST), unwrapper=keys
        ).read_all()
    return _parse_manifest(plaintext, tenant, job_id, step)


def _parse_manifest(plaintext: bytes, tenant: str, job_id: str, step: int) -> CheckpointInfo:
    try:
        document = json.loads(plaintext)
        if document["format"] != MANIFEST_FORMAT:
            raise UnsupportedFormatError(f"manifest format {document['format']} is not {MANIFEST_FORMAT}")
        info = CheckpointInfo(
            tenant=document["tenant"],
            job_id=document["job_id"],
            step=document["step"],
            created_at=document["created_at"],
            shards=tuple(ShardInfo(**shard) for shard in document["shards"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ManifestError(f"malformed manifest of {tenant}/{job_id} step {step}: {error}") from None
    if not _well_typed(info):
        raise ManifestError(f"malformed manifest of {tenant}/{job_id} step {step}: a field has the wrong type")
    if (info.tenant, info.job_id, info.step) != (tenant, job_id, step):
        raise ManifestError(f"manifest names {info.tenant}/{info.job_id} step {info.step}")
    if not info.shards or any(shard.kind not in (KIND_TORCH, KIND_BYTES) for shard in info.shards):
        raise ManifestError(f"manifest of {tenant}/{job_id} step {step} lists no or unknown shards")
    return info


def _well_typed(info: CheckpointInfo) -> bool:
    """Every manifest field has its one JSON type (``100.0`` or ``true`` is not a step or a size)."""
    strings = (info.tenant, info.job_id, info.created_at)
    return (
        all(type(text) is str for text in strings)
        and type(info.step) is int
        and all(
            type(shard.name) is str
            and type(shard.kind) is str
            and type(shard.sealed_digest) is str
            and type(shard.plaintext_size) is int
            and type(shard.sealed_size) is int
            for shard in info.shards
        )
    )


def read_shard(
    store: BlobStore, *, tenant: str, job_id: str, step: int, shard: ShardInfo, keys: KeyUnwrapper
) -> Iterator[bytes]:
    """Yield a shard's authenticated plaintext segment by segment (bounded memory).

    Each yielded segment has passed its tag; the shard's size and digest are
    checked against ``shard`` (from a verified manifest) after the last one,
    so a consumer must treat the data as valid only once iteration finishes.
    """
    with _open_shard(store, tenant, job_id, step, shard, keys) as decryptor:
        received = 0
        for segment in decryptor:
            received += len(segment)
            if received > shard.plaintext_size:
                raise ShardMismatchError(f"shard {shard.name!r} is longer than its manifest records")
            yield segment
    _check_against_manifest(decryptor, shard, tenant, job_id, step)


def read_shard_buffer(
    store: BlobStore, *, tenant: str, job_id: str, step: int, shard: ShardInfo, keys: KeyUnwrapper
) -> memoryview:
    """A shard's whole plaintext, decrypted in place into one writable buffer of its manifest size.

    The buffer is returned only once every segment passed its tag and the
    shard's size and digest matched the manifest; on any failure it is dropped.
    """
    buffer = _plaintext_buffer(shard.plaintext_size)
    with _open_shard(store, tenant, job_id, step, shard, keys) as decryptor:
        try:
            decryptor.read_into(buffer)
        except BufferTooSmallError:
            raise ShardMismatchError(f"shard {shard.name!r} is longer than its manifest records") from None
    _check_against_manifest(decryptor, shard, tenant, job_id, step)
    return buffer


def read_shard_bytes(
    store: BlobStore, *, tenant: str, job_id: str, step: int, shard: ShardInfo, keys: KeyUnwrapper
) -> bytes:
    """A shard's whole plaintext as bytes, returned only once its size and digest matched the manifest."""
    return bytes(read_shard_buffer(store, tenant=tenant, job_id=job_id, step=step, shard=shard, keys=keys))


def _plaintext_buffer(size: int) -> memoryview:
    """``size`` writable bytes of private anonymous memory, faulted in up front.

    Transparent huge pages are asked for and the range populated by one call
    (a 2 MiB fault zeroes what takes 512 faults of 4 KiB pages); where the
    kernel offers neither, the 4 KiB pages are populated with the mapping.
    """
    if size == 0:
        return memoryview(bytearray())
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    memory = mmap.mmap(-1, size, flags=flags)
    try:
        memory.madvise(mmap.MADV_HUGEPAGE)
        memory.madvise(_MADV_POPULATE_WRITE)
    except (AttributeError, OSError):
        memory.close()
        memory = mmap.mmap(-1, size, flags=flags | getattr(mmap, "MAP_POPULATE", 0))
    return memoryview(memory)


@contextmanager
def _open_shard(
    store: BlobStore, tenant: str, job_id: str, step: int, shard: ShardInfo, keys: KeyUnwrapper
) -> Iterator[StreamDecryptor]:
    try:
        reader = store.get(object_key(tenant, job_id, step, shard.name))
    except BlobNotFoundError:
        raise MissingShardError(f"shard {shard.name!r} of {tenant}/{job_id} step {step} is missing") from None
    with reader:
        context = StreamContext(tenant, job_id, step, shard.name)
        yield StreamDecryptor(reader, context=context, unwrapper=keys, expected_sealed_size=shard.sealed_size)


def _check_against_manifest(decryptor: StreamDecryptor, shard: ShardInfo, tenant: str, job_id: str, step: int) -> None:
    summary = decryptor.summary
    assert summary is not None  # set once the final segment is authenticated
    if (summary.plaintext_size, summary.sealed_size, summary.sealed_digest) != (
        shard.plaintext_size,
        shard.sealed_size,
        shard.sealed_digest,
    ):
        raise ShardMismatchError(f"shard {shard.name!r} of {tenant}/{job_id} step {step} differs from its manifest")


def load_checkpoint(
    store: BlobStore,
    *,
    tenant: str,
    job_id: str,
    step: int,
    keys: KeyUnwrapper,
    only: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """Verify the checkpoint's manifest and its shards (those ``only`` accepts), then deserialise and return them."""
    info = read_manifest(store, tenant=tenant, job_id=job_id, step=step, keys=keys)
    shards = [shard for shard in info.shards if only is None or only(shard.name)]
    plaintexts = {
        shard.name: read_shard_buffer(store, tenant=tenant, job_id=job_id, step=step, shard=shard, keys=keys)
        for shard in shards
    }
    return {shard.name: _deserialise(shard.kind, plaintexts.pop(shard.name)) for shard in shards}


def read_unlisted_shard(
    store: BlobStore, *, tenant: str, job_id: str, step: int, name: str, keys: KeyUnwrapper
) -> bytes | None:
    """The plaintext of a shard sealed at ``step`` but not listed in a manifest, or None if it is absent."""
    try:
        reader = store.get(object_key(tenant, job_id, _checked_step(step), _checked_name(name, "shard name")))
    except BlobNotFoundError:
        return None
    with reader:
        return StreamDecryptor(reader, context=StreamContext(tenant, job_id, step, name), unwrapper=keys).read_all()


def _deserialise(kind: str, plaintext: memoryview) -> Any:
    if kind == KIND_BYTES:
        return bytes(plaintext)
    return _torch_load_views(plaintext)


def _torch_load_views(plaintext: memoryview) -> Any:
    """``torch.load(weights_only=True)`` of the ``torch.save`` archive in ``plaintext``, its tensors views of it.

    This is the path ``torch.load(mmap=True)`` takes for a file, with the
    verified plaintext standing in for the mapped file: the archive stores
    each storage uncompressed (and 64-byte aligned), so each becomes a slice of
    one storage over ``plaintext`` instead of a copy, and the slices keep the
    buffer alive. The pickle is read by torch's weights-only unpickler, as
    ``torch.load(weights_only=True)`` reads it.
    """
    import torch  # here, not at the top: the server lists and streams checkpoints without torch
    from torch import serialization

    with serialization._open_zipfile_reader(cast("IO[bytes]", _ViewFile(plaintext))) as archive:
        storage = torch.frombuffer(plaintext, dtype=torch.uint8).untyped_storage()
        return serialization._load(
            archive, "cpu", serialization._weights_only_unpickler, overall_storage=storage, encoding="utf-8"
        )


class _ViewFile(io.RawIOBase):
    """A read-only, seekable file over a buffer, so ``torch.load`` reads its storages straight out of it."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._position = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}[whence]
        if start + offset < 0:
            raise ValueError(f"negative seek position {start + offset}")
        self._position = start + offset
        return self._position

    def readinto(self, buffer: Any) -> int:
        into = memoryview(buffer).cast("B")
        part = self._view[self._position : self._position + len(into)]
        into[: len(part)] = part
        self._position += len(part)
        return len(part)


def _manifest_steps(store: BlobStore, tenant: str, job_id: str) -> list[int]:
    prefix = checkpoints_prefix(tenant, job_id)
    suffix = f"/{MANIFEST}{SEALED_SUFFIX}"
    steps = (_step_of(key[len(prefix) : -len(suffix)]) for key in store.list(prefix) if key.endswith(suffix))
    return sorted(step for step in steps if step is not None)


def list_checkpoints(store: BlobStore, *, tenant: str, job_id: str, keys: KeyUnwrapper) -> list[CheckpointInfo]:
    """Checkpoints with a valid manifest, oldest first; invalid manifests are logged and skipped."""
    found = []
    for step in _manifest_steps(store, tenant, job_id):
        try:
            found.append(read_manifest(store, tenant=tenant, job_id=job_id, step=step, keys=keys))
        except (IntegrityError, CheckpointNotFoundError) as error:
            log.warning("ignoring checkpoint %s/%s step %d: %s", tenant, job_id, step, error)
    return found


def latest_checkpoint(store: BlobStore, *, tenant: str, job_id: str, keys: KeyUnwrapper) -> CheckpointInfo | None:
    """The newest checkpoint with a valid manifest (the one to resume from), if any."""
    checkpoints = list_checkpoints(store, tenant=tenant, job_id=job_id, keys=keys)
    return checkpoints[-1] if checkpoints else None


def delete_checkpoint(store: BlobStore, *, tenant: str, job_id: str, step: int) -> None:
    """Remove a checkpoint: its manifest first, so a partial deletion leaves no checkpoint."""
    prefix = _step_prefix(tenant, job_id, step)
    manifest = object_key(tenant, job_id, step, MANIFEST)
    store.delete(manifest)
    for key in store.list(prefix):
        store.delete(key)


def delete_job_checkpoints(store: BlobStore, *, tenant: str, job_id: str) -> int:
    """Remove every object of a job's checkpoints, manifests first; returns how many objects were deleted."""
    prefix = checkpoints_prefix(tenant, job_id)
    keys = store.list(prefix)
    for key in sorted(keys, key=lambda k: not k.endswith(f"/{MANIFEST}{SEALED_SUFFIX}")):
        store.delete(key)
    return len(keys)


def prune_checkpoints(store: BlobStore, *, tenant: str, job_id: str, keep_last: int) -> list[int]:
    """Keep the newest ``keep_last`` checkpoints; delete older ones and older manifest-less leftovers.

    Returns the deleted steps.
    """
    kept = _manifest_steps(store, tenant, job_id)[-keep_last:]
    if not kept:
        return []
    prefix = checkpoints_prefix(tenant, job_id)
    present = {key[len(prefix) :].partition("/")[0] for key in store.list(prefix)}
    doomed = sorted(step for step in map(_step_of, present) if step is not None and step < kept[0])
    for step in doomed:
        delete_checkpoint(store, tenant=tenant, job_id=job_id, step=step)
    return doomed


def _sealed_objects(store: BlobStore, tenant: str, job_id: str) -> Iterator[tuple[str, StreamContext]]:
    prefix = checkpoints_prefix(tenant, job_id)
    for key in store.list(prefix):
        folder, _, name = key[len(prefix) :].partition("/")
        step = _step_of(folder)
        if step is not None and name.endswith(SEALED_SUFFIX):
            yield key, StreamContext(tenant, job_id, step, name[: -len(SEALED_SUFFIX)])


def key_versions_in_use(store: BlobStore, *, tenant: str, job_id: str) -> set[int]:
    """The KEK versions that wrap the data keys of the job's stored objects (headers only)."""
    versions = set()
    for key, _ in _sealed_objects(store, tenant, job_id):
        with store.get(key) as reader:
            versions.add(envelope_key_version(StreamHeader.read(reader).key_envelope))
    return versions


def rewrap_checkpoints(store: BlobStore, *, tenant: str, job_id: str, keys: JobKeys) -> int:
    """Re-wrap every object's data key under ``keys.current``; return how many objects changed.

    Only headers change: segment bodies are copied as they are, never
    decrypted, and the sealed digests in the manifests stay valid. Objects
    already wrapped under the current version are left alone.
    """
    changed = 0
    for key, context in _sealed_objects(store, tenant, job_id):
        with store.get(key) as reader:
            header = StreamHeader.read(reader)
            if envelope_key_version(header.key_envelope) == keys.current.version:
                continue
            if header.context != context:
                raise ContextMismatchError(f"{key} is sealed for {header.context}; not re-wrapping it")
            rewrapped = rewrap_header(header, keys, keys.current)
            with store.writer(key) as upload:
                upload.write(rewrapped.encode())
                while chunk := reader.read(COPY_CHUNK_SIZE):
                    upload.write(chunk)
        changed += 1
    return changed
