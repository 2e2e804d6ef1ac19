"""What the ranks of a sharded worker group agree on, so that their shards stay one model.

In a decentralized job whose worker groups are FSDP2-sharded (``dp_shard =
ranks_per_worker``), rank r of a group swaps, screens and averages only its own
parameter shard, with rank r of the peer groups. Each shard's edge is committed
symmetrically by the transport, but a link can fail for one shard and not for
another; if each rank mixed what it alone received, one model would be made of
shards mixed with different peers. So after every exchange the group's ranks
gather what each saw (``GroupAgreement.gather``, one small all-gather over the
group's own ``torch.distributed`` group) and all of them keep the same thing: an
edge only if every shard used it, a peer only if no shard's screening rejected
it, one clipping factor for the whole update, and an all-reduce's result only if
every shard's all-reduce succeeded. Both ends of an edge see the same per-shard
commits, so both groups drop a partly failed edge together and the mixing stays
doubly stochastic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from cantata.security.anomaly.screening import LayerLayout


class GroupAgreement:
    """A worker group's ranks agreeing on one value each round (a no-op for a group of one rank)."""

    def __init__(self, group: dist.ProcessGroup | None):
        self._group = group

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (a collective: every rank of the group calls it)."""
        if self._group is None:
            return [value]
        values: list[Any] = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(values, value, group=self._group)
        return values

    def common(self, mine: Iterable[int]) -> set[int]:
        """The members of ``mine`` that every rank has too."""
        sets = [set(s) for s in self.gather(sorted(mine))]
        return set.intersection(*sets)

    def all(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank."""
        return all(self.gather(bool(ok)))

    def first(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        return self.gather(value)[0]


def local_shards(model: torch.nn.Module) -> list[torch.Tensor]:
    """This rank's part of each parameter, as tensors that share the parameters' storage.

    A parameter sharded by FSDP2 is a DTensor: its local tensor is the shard (possibly empty);
    writing into it writes the parameter. An unsharded parameter is its own shard. FSDP2 leaves
    the root's parameters gathered after a forward without a backward (an evaluation): they are
    sharded again first.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]


def shard_layout(model: torch.nn.Module) -> LayerLayout:
    """Where each parameter's shard lies in this rank's flat shard vector (empty shards are left out)."""
    return LayerLayout.from_shapes(
        (name, shard.shape)
        for (name, _), shard in zip(model.named_parameters(), local_shards(model), strict=True)
        if shard.numel()
    )
