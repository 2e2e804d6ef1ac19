"""Where a parameter's local shard lies in its full tensor, on a mesh or not."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


class ShardLayoutError(RuntimeError):
    """A shard is not the block of the full tensor its placements say."""


def local_block(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's part of ``param`` and the index in the full tensor it starts at (the whole of a plain tensor).

    FSDP2 and tensor parallelism give every rank one block: contiguous rows of
    dimension 0 and, under a row-parallel plan, a range of columns.
    """
    if not isinstance(param, DTensor):
        return param, (0,) * param.dim()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    local = param.to_local()
    if tuple(local.shape) != tuple(shape):
        raise ShardLayoutError(f"a shard of shape {tuple(local.shape)} is not the block {shape} at {offset}")
    return local, tuple(offset)
