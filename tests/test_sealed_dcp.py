"""The sealed DCP writer and reader on their own: how items lie in a rank's object, and reading them back.

Sealing itself is left out (``seal`` keeps each object's plaintext in memory):
tests/test_parallel.py covers sealed objects in real stores, tampering included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
import torch.distributed.checkpoint as dcp

from cantata.security.sealed_checkpoint import KIND_BYTES, ShardInfo
from cantata.trainer.sealed_dcp import (
    ALIGNMENT,
    METADATA,
    Extent,
    SafeLoadPlanner,
    SealedReader,
    SealedWriter,
    consolidate,
    decode_metadata,
    encode_metadata,
)


def odd_state() -> dict:
    """Tensors whose byte sizes are no multiple of the next one's element size, and a non-tensor value between."""
    generator = torch.Generator().manual_seed(0)
    return {
        "model": {
            "a": torch.rand(3, generator=generator).bfloat16(),  # 6 bytes
            "b": torch.rand(5, 7, generator=generator),
            "c": torch.rand(3, generator=generator, dtype=torch.float64),
            "flag": torch.tensor([True, False, True]),
            "d": torch.rand(2, 3, generator=generator),
        },
        "progress": {"step": 7},
    }


def targets() -> dict:
    return {"model": {name: torch.zeros_like(t) for name, t in odd_state()["model"].items()}, "progress": {"step": 0}}


def save(state: dict) -> dict[str, bytes]:
    objects: dict[str, bytes] = {}

    def seal(name: str, parts: Iterable[bytes | memoryview]) -> ShardInfo:
        objects[name] = b"".join(bytes(part) for part in parts)
        return ShardInfo(name, KIND_BYTES, len(objects[name]), len(objects[name]), "")

    dcp.save(state, storage_writer=SealedWriter(seal, "train"), no_dist=True)
    return objects


def load(objects: dict[str, bytes]) -> dict:
    loaded = targets()
    reader = SealedReader(lambda name: bytearray(objects[name]), "train")  # writable, as the worker's buffers are
    dcp.load(loaded, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return loaded


def assert_loaded(loaded: dict) -> None:
    expected = odd_state()
    assert loaded["progress"] == expected["progress"]
    for name, tensor in expected["model"].items():
        assert loaded["model"][name].dtype == tensor.dtype and torch.equal(loaded["model"][name], tensor), name


def test_every_item_starts_aligned_and_loads_back() -> None:
    objects = save(odd_state())
    extents = decode_metadata(objects[f"train.{METADATA}"]).storage_data.values()
    assert len(extents) == 6 and all(extent.offset % ALIGNMENT == 0 for extent in extents)
    assert sorted(extent.offset for extent in extents)[-1] > 0
    assert_loaded(load(objects))
    consolidated = consolidate(objects.__getitem__, "train", "model.")  # read-only plaintext (bytes) too
    assert all(torch.equal(consolidated[name], t) for name, t in odd_state()["model"].items())


def test_an_object_written_before_items_were_aligned_still_loads() -> None:
    objects = save(odd_state())
    metadata = decode_metadata(objects[f"train.{METADATA}"])
    packed, extents = bytearray(), {}
    for index, extent in sorted(metadata.storage_data.items(), key=lambda item: item[1].offset):
        extents[index] = Extent(extent.object, len(packed), extent.length)
        packed += objects[extent.object][extent.offset : extent.offset + extent.length]
    assert any(extent.offset % 8 for extent in extents.values())  # some tensor now starts off its dtype's boundary
    legacy = {
        "train.0": bytes(packed),
        f"train.{METADATA}": encode_metadata(dataclasses.replace(metadata, storage_data=extents)),
    }
    assert_loaded(load(legacy))
    consolidated = consolidate(legacy.__getitem__, "train", "model.")
    assert all(torch.equal(consolidated[name], t) for name, t in odd_state()["model"].items())
