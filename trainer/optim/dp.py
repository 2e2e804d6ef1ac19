"""DP-Canzona: data-parallel Muon where each matrix is updated whole by one owner rank.

Per bucket, the matrices each rank owns lie side by side in one exact-size
slice (no padding). Every slice is summed onto its owner with `reduce`, the
owner runs the Muon update with no communication, and a `broadcast` from the
owner returns the new parameters to every rank. All reduces are launched at
once, so later buckets travel while the first ones are being computed, and each
bucket's broadcasts start as soon as it is done. The collectives move exactly
the gradient's elements, however uneven the slices; padded reduce-scatter and
all-gather would move D times the largest slice of every bucket, which on
Qwen3 with whole-matrix ownership is up to D times the gradient. Momentum lives
only on the owner (ZeRO-1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from .buckets import build_buckets
from .cost import update_cost
from .muon import MUON_DEFAULTS, MuonConfig, check_splits, muon_update_
from .partition import ShardingPlan, alpha_balanced_plan
from .profiling import StepStats

STATE_FORMAT = "cantata.canzona-dp/1"


@dataclass(frozen=True)
class OwnerSlice:
    """The parameters one owner holds in a bucket, side by side from `start` of the bucket's buffer."""

    owner: int
    start: int
    params: tuple[int, ...]
    numel: int


def owner_slices(plan: ShardingPlan) -> list[list[OwnerSlice]]:
    """Per bucket, the non-empty slice of every owner in rank order: the exact collectives a step issues."""
    layouts = []
    for bucket, owners in zip(plan.buckets, plan.owners, strict=True):
        slices, start = [], 0
        for rank in range(plan.world_size):
            mine = [(p, n) for p, n, o in zip(bucket.params, bucket.numels, owners, strict=True) if o == rank]
            if mine:
                numel = sum(n for _, n in mine)
                slices.append(OwnerSlice(rank, start, tuple(p for p, _ in mine), numel))
                start += numel
        layouts.append(slices)
    return layouts


def collective_elements(plan: ShardingPlan) -> int:
    """Elements one step hands to reduce (and again to broadcast): the gradient's, exactly."""
    return sum(s.numel for slices in owner_slices(plan) for s in slices)


def received_gradients(params: Sequence[Tensor], group: dist.ProcessGroup | None) -> list[bool]:
    """Whether any rank of `group` holds a gradient of each parameter (one small all-reduce)."""
    flags = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return [bool(flag) for flag in flags]


class DataParallelMuon:
    """Muon over a data-parallel group with Canzona's alpha-balanced static ownership.

    `process_group=None` means a single process (every matrix is owned locally).
    Every rank must construct it with the same parameters in the same order.
    A 3-D parameter is a stack of expert matrices; `splits` maps a name to the row
    counts of a fused projection's sub-matrices.
    """

    def __init__(
        self,
        named_params: Sequence[tuple[str, Tensor]],
        *,
        process_group: dist.ProcessGroup | None = None,
        alpha: float = 1.0,
        bucket_elements: int = MUON_DEFAULTS["canzona_bucket_elements"],
        cost_unit: str = MUON_DEFAULTS["canzona_cost_unit"],
        config: MuonConfig = MuonConfig(),
        splits: Mapping[str, tuple[int, ...]] | None = None,
        plan: ShardingPlan | None = None,
    ) -> None:
        self.names = [name for name, _ in named_params]
        self.params = [param for _, param in named_params]
        self.splits = [tuple((splits or {}).get(name, ())) for name in self.names]
        for name, param, parts in zip(self.names, self.params, self.splits, strict=True):
            check_splits(name, tuple(param.shape), parts)
        self.group = process_group
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.config = config
        numels = [p.numel() for p in self.params]
        if plan is None:
            costs = [
                update_cost(tuple(p.shape), unit=cost_unit, splits=parts, ns_steps=config.ns_steps)
                for p, parts in zip(self.params, self.splits, strict=True)
            ]
            plan = alpha_balanced_plan(build_buckets(numels, bucket_elements), costs, self.world_size, alpha)
        if plan.world_size != self.world_size:
            raise ValueError(f"plan is for {plan.world_size} ranks, group has {self.world_size}")
        self.plan = plan
        self._slices = owner_slices(plan)
        self.owned = sorted(p for p, owner in plan.owner_by_param().items() if owner == self.rank)
        self.momentum = {index: torch.zeros_like(self.params[index]) for index in self.owned}

    def rank_flops(self) -> list[float]:
        """Newton-Schulz FLOPs of the matrices each rank owns (the plan's compute load)."""
        loads = [0.0] * self.world_size
        for index, owner in self.plan.owner_by_param().items():
            shape = tuple(self.params[index].shape)
            loads[owner] += update_cost(shape, unit="flops", splits=self.splits[index], ns_steps=self.config.ns_steps)
        return loads

    @torch.no_grad()
    def step(self, *, lr: float, weight_decay: float) -> StepStats:
        """Average gradients, update owned matrices that received a gradient on some rank, and leave
        identical parameters on every rank (matrices with no gradient anywhere are not touched)."""
        stats = StepStats()
        active = received_gradients(self.params, self.group)
        if self.world_size == 1:
            for index in self.owned:
                if active[index]:
                    self._update(index, self._grad(index), lr, weight_decay, stats)
            return stats
        reduced = [self._launch_reduce(slices, stats) for slices in self._slices]
        broadcasts = []
        for slices, (buffer, works) in zip(self._slices, reduced, strict=True):
            for work in works:
                work.wait()
            for piece in slices:
                if piece.owner == self.rank:
                    offset = piece.start
                    for index in piece.params:
                        view = buffer[offset : offset + self.params[index].numel()].view(self.params[index].shape)
                        offset += self.params[index].numel()
                        if active[index]:
                            view.div_(self.world_size)
                            self._update(index, view, lr, weight_decay, stats)
                        view.copy_(self.params[index])
                broadcasts.append((buffer, piece, self._collective(dist.broadcast, buffer, piece, stats)))
        for buffer, piece, work in broadcasts:
            work.wait()
            if piece.owner != self.rank:
                offset = piece.start
                for index in piece.params:
                    self.params[index].copy_(
                        buffer[offset : offset + self.params[index].numel()].view_as(self.params[index])
                    )
                    offset += self.params[index].numel()
        return stats

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state: momentum of the matrices it owns, by name."""
        return {
            "format": STATE_FORMAT,
            "world_size": self.world_size,
            "rank": self.rank,
            "momentum": {self.names[i]: self.momentum[i].clone() for i in self.owned},
        }

    def load_state_dict(self, state: dict) -> None:
        """Load momentum for the owned matrices from a shard of the same world size or a merged state."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a DP-Canzona optimizer state (format {state.get('format')!r})")
        momentum = state["momentum"]
        missing = [self.names[i] for i in self.owned if self.names[i] not in momentum]
        if missing:
            raise KeyError(
                f"optimizer state lacks momentum for {len(missing)} matrices this rank owns (first: {missing[0]!r}); "
                "to change the world size, load a state merged from every rank's shard"
            )
        for index in self.owned:
            saved = momentum[self.names[index]]
            if saved.shape != self.params[index].shape:
                raise ValueError(
                    f"momentum for {self.names[index]!r} has shape {tuple(saved.shape)}, "
                    f"parameter has {tuple(self.params[index].shape)}"
                )
            self.momentum[index].copy_(saved)

    def _launch_reduce(self, slices: list[OwnerSlice], stats: StepStats) -> tuple[Tensor, list[dist.Work]]:
        reference = self.params[slices[0].params[0]]
        buffer = reference.new_empty(sum(piece.numel for piece in slices))
        offset = 0
        for piece in slices:
            for index in piece.params:
                buffer[offset : offset + self.params[index].numel()].copy_(self._grad(index).reshape(-1))
                offset += self.params[index].numel()
        return buffer, [self._collective(dist.reduce, buffer, piece, stats) for piece in slices]

    def _collective(self, operation, buffer: Tensor, piece: OwnerSlice, stats: StepStats) -> dist.Work:
        """`reduce` to, or `broadcast` from, the slice's owner, asynchronously."""
        root = dist.get_global_rank(self.group, piece.owner) if self.group is not None else piece.owner
        work = operation(buffer[piece.start : piece.start + piece.numel], root, group=self.group, async_op=True)
        assert work is not None  # async_op=True
        stats.collective_elements += piece.numel
        stats.wire_bytes += piece.numel * buffer.element_size()  # a pipelined tree or ring: about one copy per rank
        return work

    def _grad(self, index: int) -> Tensor:
        grad = self.params[index].grad
        return grad if grad is not None else torch.zeros_like(self.params[index])

    def _update(self, index: int, grad: Tensor, lr: float, weight_decay: float, stats: StepStats) -> None:
        with stats.computing():
            muon_update_(
                self.params[index],
                grad,
                self.momentum[index],
                lr=lr,
                weight_decay=weight_decay,
                config=self.config,
                splits=self.splits[index],
            )
        stats.updated_matrices += 1
