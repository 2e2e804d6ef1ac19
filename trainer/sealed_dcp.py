"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), every object sealed.

:class:`SealedWriter` is a DCP storage writer: each rank streams the items of
its save plan (its own shards of every tensor, plus small non-tensor values)
into one sealed object, ``PART.RANK``, through the ``seal`` callable it is
given (the job's streaming AEAD, see ``cantata.security.sealed_checkpoint``);
the coordinator then seals DCP's metadata, as JSON, as ``PART.metadata``.
Those objects are listed in the checkpoint's manifest like any other shard,
so the manifest, written last, still makes the checkpoint exist.

:class:`SealedReader` reads them back through ``read``, a callable returning an
object's plaintext only once it verified against the manifest; DCP's planner
picks, for each tensor this rank holds on *its* mesh, the stored chunks that
overlap it, so a checkpoint taken on one mesh loads on another. Tensors are
stored as raw bytes (their dtype and shape are in the metadata), each item
starting at a multiple of ``ALIGNMENT``, and read back as views of the
object's verified plaintext, copied once into their targets; other values are
read back with ``torch.load(weights_only=True)``: no pickle is trusted. :func:`consolidate` builds full tensors from the same objects
without any process group (``cantata checkpoints download --consolidate``).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch.distributed.checkpoint import (
    CheckpointException,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    StorageReader,
    StorageWriter,
)
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

Plaintext = bytes | bytearray | memoryview  # an object's verified plaintext
Written = TypeVar("Written")  # what ``seal`` returns for an object: its ShardInfo, or its staged copy

METADATA = "metadata"  # the coordinator's object: ``PART.metadata``
FORMAT = 1
ALIGNMENT = 64  # where each stored item starts in its object, so a tensor is read back as a view of any dtype


class ShardedFormatError(ValueError):
    """A sharded checkpoint's metadata is malformed, or names an object or extent that does not fit."""


@dataclass(frozen=True)
class Extent:
    """Where one stored item lies: a byte range of one rank's sealed object."""

    object: str
    offset: int
    length: int


def _raw(data: torch.Tensor | io.BytesIO) -> memoryview:
    """The bytes of ``data``: a view of a CPU tensor's own memory (a copy only if it lives elsewhere or is strided)."""
    if isinstance(data, io.BytesIO):
        return data.getbuffer()
    return data.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data


class SealedWriter(StorageWriter, Generic[Written]):
    """Each rank seals its own items as ``PART.RANK``; the coordinator seals the metadata as ``PART.metadata``.

    ``seal`` may instead copy an object's parts to seal them later (an asynchronous save).
    """

    def __init__(self, seal: Callable[[str, Iterable[bytes | memoryview]], Written], part: str):
        super().__init__()
        self._seal, self._part = seal, part
        self.written: list[Written] = []  # what ``seal`` returned for each object of this rank

    def reset(self, checkpoint_id=None) -> None:
        self.written = []

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=f"{self._part}.{rank}") for rank, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        name: str = plan.storage_data
        results: list[WriteResult] = []

        def parts() -> Iterator[bytes | memoryview]:
            offset = 0
            for item in plan.items:
                raw = _raw(planner.resolve_data(item))
                if padding := -offset % ALIGNMENT:
                    yield bytes(padding)
                    offset += padding
                results.append(WriteResult(item.index, len(raw), Extent(name, offset, len(raw))))
                offset += len(raw)
                yield raw

        self.written.append(self._seal(name, parts()))
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {result.index: result.storage_data for ranks in results for result in ranks}
        self.written.append(self._seal(f"{self._part}.{METADATA}", [encode_metadata(metadata)]))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


class SealedReader(StorageReader):
    """Reads ``PART.*`` objects through ``read`` (verified plaintext, best writable), each at most once per load."""

    def __init__(self, read: Callable[[str], Plaintext], part: str):
        super().__init__()
        self._read, self._part = read, part
        self._metadata: Metadata | None = None

    def reset(self, checkpoint_id=None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return decode_metadata(self._read(f"{self._part}.{METADATA}"))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self._metadata is not None  # DCP sets the reader up before it reads
        by_object: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            by_object.setdefault(_extent(self._metadata, item.storage_index).object, []).append(item)
        for name in sorted(by_object):
            data = _bytes_tensor(self._read(name))
            for item in by_object[name]:
                raw = _slice(data, _extent(self._metadata, item.storage_index))
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(raw.numpy().tobytes()))
                    continue
                stored = _tensor(raw, *_chunk(self._metadata, item.storage_index))
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
                    stored = stored.narrow(dim, start, length)
                target = planner.resolve_tensor(item).detach()
                if target.size() != stored.size():
                    raise ShardedFormatError(
                        f"{item.storage_index.fqn}: stored {stored.size()}, wanted {target.size()}"
                    )
                target.copy_(stored)
                planner.commit_tensor(item, target)
            del data  # the object's plaintext goes before the next one is read
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, reading non-tensor values with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


@contextmanager
def first_failure() -> Iterator[None]:
    """Raise the first rank's own error out of DCP's ``CheckpointException`` (a BaseException wrapping each rank's)."""
    try:
        yield
    except CheckpointException as failed:
        for rank in sorted(failed.failures):
            error, _ = failed.failures[rank]
            if isinstance(error, Exception):
                raise error from None
        raise RuntimeError(f"sharded checkpoint failed: {failed}") from None


def _extent(metadata: Metadata, index: MetadataIndex) -> Extent:
    try:
        return metadata.storage_data[index]
    except KeyError:
        raise ShardedFormatError(f"no stored extent for {index.fqn} at {list(index.offset or ())}") from None


def _chunk(metadata: Metadata, index: MetadataIndex) -> tuple[torch.dtype, torch.Size]:
    entry = metadata.state_dict_metadata.get(index.fqn)
    if not isinstance(entry, TensorStorageMetadata):
        raise ShardedFormatError(f"{index.fqn} is not a stored tensor")
    for chunk in entry.chunks:
        if chunk.offsets == index.offset:
            return entry.properties.dtype, chunk.sizes
    raise ShardedFormatError(f"{index.fqn} has no chunk at {list(index.offset or ())}")


def _bytes_tensor(plaintext: Plaintext) -> torch.Tensor:
    """A uint8 tensor over ``plaintext``'s memory (read-only plaintext, such as ``bytes``, is copied once)."""
    view = memoryview(plaintext).cast("B")
    if not view:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(view) if view.readonly else view, dtype=torch.uint8)


def _slice(data: torch.Tensor, extent: Extent) -> torch.Tensor:
    if extent.offset < 0 or extent.length < 0 or extent.offset + extent.length > len(data):
        raise ShardedFormatError(f"extent {extent} lies outside its object ({len(data)} bytes)")
    return data[extent.offset : extent.offset + extent.length]


def _tensor(raw: torch.Tensor, dtype: torch.dtype, size: torch.Size) -> torch.Tensor:
    """The chunk stored in ``raw`` (uint8): a view of it, or a copy where it does not start on a ``dtype`` boundary."""
    expected = size.numel() * dtype.itemsize
    if len(raw) != expected:
        raise ShardedFormatError(f"a {dtype} chunk of {list(size)} needs {expected} bytes, not {len(raw)}")
    if not expected:
        return torch.empty(size, dtype=dtype)
    if raw.storage_offset() % dtype.itemsize:  # written before items were aligned
        raw = raw.clone()
    return raw.view(dtype).reshape(size)


def encode_metadata(metadata: Metadata) -> bytes:
    """DCP's metadata as JSON (its own pickle is never read back)."""
    entries: dict[str, Any] = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            entries[fqn] = None
        else:
            entries[fqn] = {
                "dtype": str(entry.properties.dtype).removeprefix("torch."),
                "size": list(entry.size),
                "chunks": [[list(chunk.offsets), list(chunk.sizes)] for chunk in entry.chunks],
            }
    extents = [
        [index.fqn, None if index.offset is None else list(index.offset), extent.object, extent.offset, extent.length]
        for index, extent in metadata.storage_data.items()
    ]
    paths = {fqn: list(path) for fqn, path in (metadata.planner_data or {}).items()}
    return json.dumps({"format": FORMAT, "entries": entries, "extents": extents, "paths": paths}).encode()


def decode_metadata(raw: Plaintext) -> Metadata:
    """Parse what :func:`encode_metadata` wrote; a malformed document is a :class:`ShardedFormatError`."""
    try:
        document = json.loads(bytes(raw))
        if document["format"] != FORMAT:
            raise ShardedFormatError(f"sharded checkpoint format {document['format']} is not {FORMAT}")
        entries: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
        for fqn, entry in document["entries"].items():
            if entry is None:
                entries[fqn] = BytesStorageMetadata()
                continue
            dtype = getattr(torch, entry["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise ShardedFormatError(f"{fqn}: {entry['dtype']!r} is not a dtype")
            chunks = [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in entry["chunks"]]
            entries[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(entry["size"]), chunks)
        extents = {
            MetadataIndex(fqn, None if offset is None else torch.Size(offset)): Extent(str(name), int(start), int(size))
            for fqn, offset, name, start, size in document["extents"]
        }
        paths = {fqn: tuple(path) for fqn, path in document["paths"].items()}
    except ShardedFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ShardedFormatError(f"malformed sharded checkpoint metadata: {error!r}") from None
    return Metadata(state_dict_metadata=entries, planner_data=paths, storage_data=extents)


def consolidate(read: Callable[[str], Plaintext], part: str, prefix: str) -> dict[str, torch.Tensor]:
    """The full tensors stored under ``prefix`` (e.g. ``"model."``), assembled from every rank's chunks."""
    metadata = decode_metadata(read(f"{part}.{METADATA}"))
    wanted = {
        fqn: entry
        for fqn, entry in metadata.state_dict_metadata.items()
        if fqn.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
    }
    objects: dict[str, torch.Tensor] = {}
    full: dict[str, torch.Tensor] = {}
    for fqn, entry in wanted.items():
        tensor = torch.empty(entry.size, dtype=entry.properties.dtype)
        for chunk in entry.chunks:
            index = MetadataIndex(fqn, chunk.offsets)
            extent = _extent(metadata, index)
            if extent.object not in objects:
                objects[extent.object] = _bytes_tensor(read(extent.object))
            view = tensor
            for dim, (start, length) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                view = view.narrow(dim, start, length)
            view.copy_(_tensor(_slice(objects[extent.object], extent), entry.properties.dtype, chunk.sizes))
        full[fqn.removeprefix(prefix)] = tensor
    return full
