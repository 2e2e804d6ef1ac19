"""DP-Canzona: data-parallel Muon where each matrix is updated whole by one owner rank.

Per bucket: a padded reduce-scatter delivers to every rank the averaged
gradients of exactly the matrices it owns; the owner runs the Muon update with
no communication; a padded all-gather returns the new parameters to every rank.
All reduce-scatters are launched at once, so later buckets travel while the
first ones are being computed, and each all-gather starts as soon as its
bucket is done. Momentum lives only on the owner (ZeRO-1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from .buckets import build_buckets
from .cost import newton_schulz_flops
from .muon import MuonConfig, muon_update_
from .partition import ShardingPlan, alpha_balanced_plan
from .profiling import StepStats, ring_bytes

STATE_FORMAT = "cantata.canzona-dp/1"


@dataclass(frozen=True)
class _Slot:
    """Where a parameter sits in its bucket's padded buffer: owner's row, offset within the row."""

    param: int
    owner: int
    offset: int


@dataclass(frozen=True)
class _BucketLayout:
    slots: tuple[_Slot, ...]
    row_elements: int


def _layouts(plan: ShardingPlan, numels: Sequence[int]) -> list[_BucketLayout]:
    layouts = []
    for bucket, owners in zip(plan.buckets, plan.owners, strict=True):
        fill = [0] * plan.world_size
        slots = []
        for param, owner in zip(bucket.params, owners, strict=True):
            slots.append(_Slot(param, owner, fill[owner]))
            fill[owner] += numels[param]
        layouts.append(_BucketLayout(tuple(slots), max(fill)))
    return layouts


class DataParallelMuon:
    """Muon over a data-parallel group with Canzona's alpha-balanced static ownership.

    `process_group=None` means a single process (every matrix is owned locally).
    Every rank must construct it with the same parameters in the same order.
    """

    def __init__(
        self,
        named_params: Sequence[tuple[str, Tensor]],
        *,
        process_group: dist.ProcessGroup | None = None,
        alpha: float = 1.0,
        bucket_elements: int = 40_000_000,
        config: MuonConfig = MuonConfig(),
        plan: ShardingPlan | None = None,
    ) -> None:
        self.names = [name for name, _ in named_params]
        self.params = [param for _, param in named_params]
        for name, param in named_params:
            if param.ndim != 2:
                raise ValueError(f"Muon updates 2-D matrices only; {name!r} has shape {tuple(param.shape)}")
        self.group = process_group
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.config = config
        numels = [p.numel() for p in self.params]
        if plan is None:
            costs = [newton_schulz_flops((p.shape[0], p.shape[1]), config.ns_steps) for p in self.params]
            plan = alpha_balanced_plan(build_buckets(numels, bucket_elements), costs, self.world_size, alpha)
        if plan.world_size != self.world_size:
            raise ValueError(f"plan is for {plan.world_size} ranks, group has {self.world_size}")
        self.plan = plan
        self._layouts = _layouts(plan, numels)
        self.owned = sorted(p for p, owner in plan.owner_by_param().items() if owner == self.rank)
        self.momentum = {index: torch.zeros_like(self.params[index]) for index in self.owned}

    @torch.no_grad()
    def step(self, *, lr: float, weight_decay: float) -> StepStats:
        """Average gradients, update owned matrices, and leave identical parameters on every rank."""
        stats = StepStats()
        if self.world_size == 1:
            for index in self.owned:
                self._update(index, self._grad(index), lr, weight_decay, stats)
            return stats
        scattered = [self._launch_reduce_scatter(layout, stats) for layout in self._layouts]
        gathers = []
        for layout, (shard, work) in zip(self._layouts, scattered, strict=True):
            work.wait()
            shard.div_(self.world_size)
            for slot in layout.slots:
                if slot.owner == self.rank:
                    view = self._view(shard, slot)
                    self._update(slot.param, view, lr, weight_decay, stats)
                    view.copy_(self.params[slot.param])
            gathered = shard.new_empty(self.world_size * layout.row_elements)
            gathers.append((layout, gathered, dist.all_gather_single(gathered, shard, group=self.group, async_op=True)))
            stats.wire_bytes += ring_bytes(layout.row_elements, self.world_size, shard.element_size())
        for layout, gathered, work in gathers:
            work.wait()
            for slot in layout.slots:
                if slot.owner != self.rank:
                    row = gathered[slot.owner * layout.row_elements : (slot.owner + 1) * layout.row_elements]
                    self.params[slot.param].copy_(self._view(row, slot))
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

    def _launch_reduce_scatter(self, layout: _BucketLayout, stats: StepStats) -> tuple[Tensor, dist.Work]:
        reference = self.params[layout.slots[0].param]
        padded = reference.new_zeros(self.world_size * layout.row_elements)
        for slot in layout.slots:
            start = slot.owner * layout.row_elements + slot.offset
            padded[start : start + self.params[slot.param].numel()].copy_(self._grad(slot.param).reshape(-1))
        shard = reference.new_empty(layout.row_elements)
        work = dist.reduce_scatter_single(shard, padded, group=self.group, async_op=True)
        stats.wire_bytes += ring_bytes(layout.row_elements, self.world_size, padded.element_size())
        return shard, work

    def _view(self, row: Tensor, slot: _Slot) -> Tensor:
        param = self.params[slot.param]
        return row[slot.offset : slot.offset + param.numel()].view(param.shape)

    def _grad(self, index: int) -> Tensor:
        grad = self.params[index].grad
        return grad if grad is not None else torch.zeros_like(self.params[index])

    def _update(self, index: int, grad: Tensor, lr: float, weight_decay: float, stats: StepStats) -> None:
        with stats.computing():
            muon_update_(
                self.params[index], grad, self.momentum[index], lr=lr, weight_decay=weight_decay, config=self.config
            )
        stats.updated_matrices += 1
