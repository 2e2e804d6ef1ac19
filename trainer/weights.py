"""Initial weights for fine-tuning (``init_from``): safetensors objects loaded one at a time into a built model.

``init_from`` is ``file:///PATH`` under the roots the job's datasets may come
from, ``s3://SOURCE@bucket/prefix`` or ``az://SOURCE@container/prefix`` (read
with the named data source's credentials): one ``.safetensors`` file or object,
or every one directly in a directory or under a prefix, in key order. Local
files and store objects go through the same loader. A directory or prefix may
be a Hugging Face Llama or Qwen3 folder: its config.json must then be the
job's model and its index, if sharded, names the files to read; tensor names
are mapped to the decoder's (:mod:`cantata.trainer.hf`). Each object's tensors are
handed to ``set_model_state_dict`` as full tensors, so on a mesh every rank
keeps only its own shard of them, and no more than one object is held at once.
Every parameter must come from some object with its exact shape; a missing or
unknown tensor fails the job, naming it and its object. A store that cannot be
read fails it with the typed data errors of :mod:`cantata.trainer.data.sources`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from cantata.storage import open_store
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

SUFFIX = ".safetensors"


class WeightsError(ValueError):
    """The initial weights are missing or do not fit the job's model."""


@dataclass(frozen=True)
class WeightObjects:
    """The safetensors objects ``init_from`` names: their keys, in load order, and how to read one whole."""

    uri: str  # where they are, for messages: the directory or prefix
    keys: tuple[str, ...]
    read: Callable[[str], bytes]
    listing: frozenset[str] = frozenset()  # every object directly there (config.json, an index), for hf


def open_weights(
    uri: str, *, roots: Sequence[Path] = (), credentials: SourceCredentials | None = None
) -> WeightObjects:
    """The objects at ``uri``: a ``file://`` path inside ``roots``, or a store prefix read with ``credentials``."""
    parsed = DatasetURI.parse(uri)
    if parsed.scheme == "file":
        path = Path(os.path.abspath(parsed.location))
        if ".." in Path(parsed.location).parts or not any(path == r or r in path.parents for r in roots):
            raise DatasetPathError(f"init_from {path} is outside the allowed roots")
        return local_weights(path, uri)
    if parsed.scheme not in ("s3", "az"):
        raise WeightsError(f"init_from {uri}: use file://, s3://SOURCE@bucket/prefix or az://SOURCE@container/prefix")
    options = source_store_options(parsed, credentials, f"init_from {uri}")
    single = parsed.prefix.endswith(SUFFIX)  # one object: list its folder, keep its name
    folder, _, name = parsed.prefix.rpartition("/") if single else (parsed.prefix, "", "")
    with translated_store_errors(f"opening init_from {uri}"):
        store = open_store(f"{parsed.scheme}://{parsed.location}/{folder}", **options)
    objects = StoreObjects(store)
    listing = frozenset(k for k in objects.sizes() if "/" not in k and k == (name or k))
    keys = sorted(k for k in listing if k.endswith(SUFFIX))
    if not keys:
        raise WeightsError(f"init_from {uri}: no {SUFFIX} object under {store.uri}")
    return WeightObjects(store.uri, tuple(keys), objects.read, listing)


def local_weights(path: Path, uri: str | None = None) -> WeightObjects:
    """``path`` itself, or the ``*.safetensors`` files directly in the directory ``path``, never through a link."""
    folder, keys = (
        (path, sorted(f.name for f in path.glob("*" + SUFFIX))) if path.is_dir() else (path.parent, [path.name])
    )
    if not keys or not all((folder / k).is_file() and k.endswith(SUFFIX) for k in keys):
        raise WeightsError(f"init_from {path}: no {SUFFIX} file there")
    listing = frozenset(f.name for f in folder.iterdir()) if path.is_dir() else frozenset(keys)
    return WeightObjects(f"{folder}/", tuple(keys), LocalDirectory(folder, uri or path.as_uri()).read, listing)


def load_weights(model: torch.nn.Module, objects: WeightObjects) -> int:
    """Load every tensor of ``objects`` into ``model``, one object at a time; returns the number read."""
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    tied = {name for name in expected if name == "lm_head.weight" and getattr(model.cfg, "tie_embeddings", False)}
    seen: set[str] = set()
    files = hf.checked_files(objects.keys, objects.listing, objects.read, model.cfg, f"init_from {objects.uri}")
    for key in files:
        where = f"{objects.uri}{key}"
        try:
            loaded = load(objects.read(key))
        except SafetensorError as error:
            raise WeightsError(f"init_from {where}: not a safetensors file ({error})") from None
        # In name order: safetensors' parser hands them over in a per-process random order, and on a mesh
        # every rank must distribute the same tensor in the same collective.
        tensors: dict[str, Any] = {hf.cantata_name(name): loaded[name] for name in sorted(loaded)}
        for name, tensor in tensors.items():
            if name not in expected:
                raise WeightsError(f"init_from {where}: tensor {name!r} is not in the model")
            if tuple(tensor.shape) != expected[name]:
                raise WeightsError(
                    f"init_from {where}: tensor {name!r} has shape {tuple(tensor.shape)}, the model's is {expected[name]}"
                )
        seen |= tensors.keys()  # before loading: set_model_state_dict fills the dict in
        set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True, strict=False))
        del loaded, tensors
    missing = sorted(set(expected) - seen - tied)
    if missing:
        raise WeightsError(
            f"init_from {objects.uri}: no tensor for {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    return len(files)
