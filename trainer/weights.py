"""Initial weights for fine-tuning (``init_from``): each rank reads only its shards' bytes of safetensors objects.

``init_from`` is ``file:///PATH`` under the roots the job's datasets may come
from, ``s3://SOURCE@bucket/prefix`` or ``az://SOURCE@container/prefix`` (read
with the named data source's credentials): one ``.safetensors`` file or object,
or every one directly in a directory or under a prefix, in key order. Local
files and store objects go through the same loader. A directory or prefix may
be a Hugging Face Llama or Qwen3 folder: its config.json must then be the
job's model and its index, if sharded, names the files to read; tensor names
are mapped to the decoder's (:mod:`cantata.trainer.hf`).

A safetensors object is an 8-byte header length, a JSON header (each tensor's
dtype, shape and byte range) and the tensors' bytes, row-major. The loader
reads the header, then for each parameter only the rows of this rank's shard
(one ranged read: a ``pread`` of a local file, an HTTP range request of an S3
or Azure object) and keeps the columns the shard holds; no rank reads a whole
object, nor a tensor's rows it does not hold, and loading needs no collective.
Every parameter must come from some object with its exact shape; a missing or
unknown tensor fails the job, naming it and its object. A store that cannot be
read fails it with the typed data errors of :mod:`cantata.trainer.data.sources`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cantata.storage import open_store
from cantata.storage import uri as stores
from cantata.trainer import hf
from cantata.trainer.data.errors import DatasetPathError
from cantata.trainer.data.sources import (
    DatasetURI,
    LocalDirectory,
    SourceCredentials,
    StoreObjects,
    source_store_options,
    translated_store_errors,
)
from cantata.trainer.shards import local_block

SUFFIX = ".safetensors"
HEADER_BYTES = 8  # the little-endian length of the JSON header that follows
HEADER_LIMIT = 100 << 20  # the largest header safetensors itself accepts
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class WeightsError(ValueError):
    """The initial weights are missing or do not fit the job's model."""


@dataclass(frozen=True)
class WeightObjects:
    """The safetensors objects ``init_from`` names: their keys, in load order, and how to read a byte range of one."""

    uri: str  # where they are, for messages: the directory or prefix
    keys: tuple[str, ...]
    read: Callable[[str], bytes]  # a whole object: config.json or an index, for hf
    read_range: Callable[[str, int, int], bytes]  # (key, offset, length) -> up to length bytes
    listing: frozenset[str] = frozenset()  # every object directly there (config.json, an index), for hf


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors object: its dtype, shape and where its bytes are in the object."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one index of dimension 0 (of the whole tensor, for a scalar)."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize


def open_weights(
    uri: str, *, roots: Sequence[Path] = (), credentials: SourceCredentials | None = None
) -> WeightObjects:
    """The objects at ``uri``: a ``file://`` path inside ``roots``, or a store prefix read with ``credentials``."""
    parsed = DatasetURI.parse(uri)
    if parsed.scheme == stores.LOCAL:
        path = Path(os.path.abspath(parsed.location))
        if ".." in Path(parsed.location).parts or not any(path == r or r in path.parents for r in roots):
            raise DatasetPathError(f"init_from {path} is outside the allowed roots")
        return local_weights(path, uri)
    if not stores.is_remote(parsed.scheme):
        raise WeightsError(f"init_from {uri}: use file://, s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix")
    options = source_store_options(parsed, credentials, f"init_from {uri}")
    single = parsed.prefix.endswith(SUFFIX)  # one object: list its folder, keep its name
    folder, _, name = parsed.prefix.rpartition("/") if single else (parsed.prefix, "", "")
    with translated_store_errors(f"opening init_from {uri}"):
        store = open_store(stores.store_uri(parsed.scheme, parsed.location, folder), **options)
    objects = StoreObjects(store)
    listing = frozenset(k for k in objects.sizes() if "/" not in k and k == (name or k))
    keys = sorted(k for k in listing if k.endswith(SUFFIX))
    if not keys:
        raise WeightsError(f"init_from {uri}: no {SUFFIX} object under {store.uri}")
    return WeightObjects(store.uri, tuple(keys), objects.read, objects.read_range, listing)


def local_weights(path: Path, uri: str | None = None) -> WeightObjects:
    """``path`` itself, or the ``*.safetensors`` files directly in the directory ``path``, never through a link."""
    folder, keys = (
        (path, sorted(f.name for f in path.glob("*" + SUFFIX))) if path.is_dir() else (path.parent, [path.name])
    )
    if not keys or not all((folder / k).is_file() and k.endswith(SUFFIX) for k in keys):
        raise WeightsError(f"init_from {path}: no {SUFFIX} file there")
    listing = frozenset(f.name for f in folder.iterdir()) if path.is_dir() else frozenset(keys)
    local = LocalDirectory(folder, uri or path.as_uri())
    return WeightObjects(f"{folder}/", tuple(keys), local.read, local.read_range, listing)


def read_header(objects: WeightObjects, key: str) -> dict[str, StoredTensor]:
    """The tensors object ``key`` holds, by stored name, from its header alone."""
    where = f"init_from {objects.uri}{key}"
    length = int.from_bytes(objects.read_range(key, 0, HEADER_BYTES), "little")
    if not 2 <= length <= HEADER_LIMIT:
        raise WeightsError(f"{where}: not a safetensors file (a header of {length} bytes)")
    try:
        header = json.loads(objects.read_range(key, HEADER_BYTES, length))
        header.pop("__metadata__", None)
        entries = {}
        for name, entry in header.items():
            begin, end = (int(o) for o in entry["data_offsets"])
            entries[name] = (DTYPES[entry["dtype"]], tuple(int(d) for d in entry["shape"]), begin, end)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise WeightsError(f"{where}: not a safetensors file (its header: {error!r})") from None
    tensors = {}
    for name, (dtype, shape, begin, end) in entries.items():
        if begin < 0 or end - begin != math.prod(shape) * dtype.itemsize:
            raise WeightsError(f"{where}: not a safetensors file (tensor {name!r}'s bytes do not fit its shape)")
        tensors[name] = StoredTensor(dtype, shape, HEADER_BYTES + length + begin)
    return tensors


def read_block(objects: WeightObjects, key: str, name: str, stored: StoredTensor, param: torch.Tensor) -> None:
    """Copy into ``param``'s local shard its block of ``stored``, reading only the rows the shard holds."""
    local, offset = local_block(param)
    if not local.numel():
        return
    first, rows = (offset[0], local.shape[0]) if stored.shape else (0, 1)
    size = rows * stored.row_bytes
    data = objects.read_range(key, stored.start + first * stored.row_bytes, size)
    if len(data) != size:
        raise WeightsError(f"init_from {objects.uri}{key}: tensor {name!r} ends past the end of the object")
    block = torch.frombuffer(bytearray(data), dtype=stored.dtype).view(rows, *stored.shape[1:])
    columns = tuple(slice(o, o + n) for o, n in zip(offset[1:], local.shape[1:], strict=True))
    local.copy_(block[(slice(None), *columns)].reshape(local.shape))


@torch.no_grad()
def load_weights(model: torch.nn.Module, objects: WeightObjects) -> int:
    """Load every tensor of ``objects`` into ``model``'s local shards, one object at a time; returns the number read."""
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied head under its own name too
    tied = {name for name in params if name == "lm_head.weight" and getattr(model.cfg, "tie_embeddings", False)}
    seen: set[str] = set()
    files = hf.checked_files(objects.keys, objects.listing, objects.read, model.cfg, f"init_from {objects.uri}")
    for key in files:
        where = f"{objects.uri}{key}"
        stored = {hf.cantata_name(name): tensor for name, tensor in read_header(objects, key).items()}
        for name, tensor in stored.items():
            if name not in params:
                raise WeightsError(f"init_from {where}: tensor {name!r} is not in the model")
            if tensor.shape != tuple(params[name].shape):
                raise WeightsError(
                    f"init_from {where}: tensor {name!r} has shape {tensor.shape}, the model's is {tuple(params[name].shape)}"
                )
        for name in sorted(stored):  # a tied tensor stored under both names: the later name wins, as it always did
            read_block(objects, key, name, stored[name], params[name])
        seen |= stored.keys()
    missing = sorted(set(params) - seen - tied)
    if missing:
        raise WeightsError(
            f"init_from {objects.uri}: no tensor for {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    return len(files)
