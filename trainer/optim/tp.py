"""TP-Canzona: Muon for matrices sharded across a tensor-parallel group.

Every full matrix gets a host rank. Matrices are processed in micro-groups
formed by greedy rollback; within a group, hosts come from an LPT packing over
the TP ranks. For each group one `all_to_all_single` gathers gradient shards
on the hosts, the hosts run momentum and Newton-Schulz on whole matrices, and a
second `all_to_all_single` scatters the update shards back. The pipeline
gathers group i+1 while group i computes, and applies group i-1 after group i
is launched. The baseline all-gathers every gradient and computes redundantly.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

from .cost import newton_schulz_flops
from .muon import MuonConfig, apply_direction, muon_direction
from .profiling import StepStats, ring_bytes


@dataclass(frozen=True)
class ShardedMatrix:
    """A matrix split evenly along `shard_dim` (0: column-parallel, 1: row-parallel) over the TP group.

    `param` is this rank's shard as a plain tensor (its `.grad` the shard's gradient) or a DTensor
    with a single `Shard` placement, as DTensor's ColwiseParallel/RowwiseParallel styles produce.
    """

    name: str
    param: Tensor
    shard_dim: int
    full_shape: tuple[int, int]

    @classmethod
    def from_dtensor(cls, name: str, param: DTensor) -> ShardedMatrix:
        placements = param.placements
        if len(placements) != 1 or not isinstance(placements[0], Shard):
            raise ValueError(f"{name!r}: expected one Shard placement on a 1-D mesh, got {placements}")
        rows, cols = param.shape
        return cls(name, param, placements[0].dim, (rows, cols))

    @property
    def shard(self) -> Tensor:
        return self.param.to_local() if isinstance(self.param, DTensor) else self.param

    def shard_grad(self) -> Tensor:
        grad = self.param.grad
        if grad is None:
            return torch.zeros_like(self.shard)
        return grad.to_local() if isinstance(grad, DTensor) else grad


def tensor_parallel_matrices(module: nn.Module) -> list[ShardedMatrix]:
    """The 2-D DTensor parameters of a module parallelized with DTensor's parallel styles."""
    return [
        ShardedMatrix.from_dtensor(name, param)
        for name, param in module.named_parameters()
        if isinstance(param, DTensor) and param.ndim == 2
    ]


@dataclass(frozen=True)
class MicroGroup:
    """Matrices (indices) updated together, and the host rank of each."""

    items: tuple[int, ...]
    hosts: tuple[int, ...]


def lpt_pack(costs: Sequence[float], slots: int) -> tuple[list[int], list[float]]:
    """Longest-processing-time-first: slot of each item (in the given order) and the slot loads."""
    heap = [(0.0, slot) for slot in range(slots)]
    assignment = [0] * len(costs)
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, slot = heapq.heappop(heap)
        assignment[index] = slot
        heapq.heappush(heap, (load + costs[index], slot))
    loads = [0.0] * slots
    for load, slot in heap:
        loads[slot] = load
    return assignment, loads


def greedy_rollback_groups(costs: Sequence[float], slots: int, capacity: float) -> list[MicroGroup]:
    """Sort by cost (descending); grow a group while its LPT packing over `slots` stays within
    `capacity`; when an item would overflow it, roll the item back, seal the group and start anew."""
    if costs and capacity < max(costs):
        raise ValueError(f"capacity {capacity:g} is below the largest matrix cost {max(costs):g}")
    groups: list[MicroGroup] = []
    current: list[int] = []
    for item in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        _, loads = lpt_pack([costs[i] for i in current + [item]], slots)
        if current and max(loads) > capacity:
            groups.append(_sealed(current, costs, slots))
            current = []
        current.append(item)
    if current:
        groups.append(_sealed(current, costs, slots))
    return groups


def _sealed(items: list[int], costs: Sequence[float], slots: int) -> MicroGroup:
    hosts, _ = lpt_pack([costs[i] for i in items], slots)
    return MicroGroup(tuple(items), tuple(hosts))


@dataclass
class _InFlight:
    group: MicroGroup
    received: Tensor
    work: dist.Work


class TensorParallelMuon:
    """Muon on TP-sharded matrices; every rank passes its own shards in the same order.

    `step` is TP-Canzona (momentum lives on each matrix's host); `step_synchronous` is the
    baseline (momentum replicated on every rank). Each keeps its own momentum: use one per run.
    """

    def __init__(
        self,
        matrices: Sequence[ShardedMatrix],
        *,
        process_group: dist.ProcessGroup,
        capacity: float | None = None,
        config: MuonConfig = MuonConfig(),
    ) -> None:
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.matrices = list(matrices)
        for m in self.matrices:
            expected = list(m.full_shape)
            if expected[m.shard_dim] % self.world_size:
                raise ValueError(
                    f"{m.name!r}: dim {m.shard_dim} of {m.full_shape} is not divisible by {self.world_size}"
                )
            expected[m.shard_dim] //= self.world_size
            if tuple(m.shard.shape) != tuple(expected):
                raise ValueError(f"{m.name!r}: shard shape {tuple(m.shard.shape)} != expected {tuple(expected)}")
        self.config = config
        costs = [newton_schulz_flops(m.full_shape, config.ns_steps) for m in self.matrices]
        self.capacity = max(costs) if capacity is None else capacity
        self.groups = greedy_rollback_groups(costs, self.world_size, self.capacity)
        self.host_momentum = {
            item: self.matrices[item].shard.new_zeros(self.matrices[item].full_shape)
            for group in self.groups
            for item, host in zip(group.items, group.hosts, strict=True)
            if host == self.rank
        }
        self.replicated_momentum: dict[int, Tensor] = {}

    @torch.no_grad()
    def step(self, *, lr: float, weight_decay: float) -> StepStats:
        """Pipelined micro-groups: gather(i+1) overlaps compute(i); apply(i-1) follows scatter(i)."""
        stats = StepStats()
        gathering = self._launch_gather(self.groups[0], stats) if self.groups else None
        scattering: _InFlight | None = None
        for index in range(len(self.groups)):
            current = gathering
            assert current is not None  # launched for this group by the previous iteration
            gathering = self._launch_gather(self.groups[index + 1], stats) if index + 1 < len(self.groups) else None
            current.work.wait()
            directions = self._compute_hosted(current, stats)
            launched = self._launch_scatter(current.group, directions, stats)
            if scattering is not None:
                self._apply(scattering, lr, weight_decay)
            scattering = launched
        if scattering is not None:
            self._apply(scattering, lr, weight_decay)
        return stats

    @torch.no_grad()
    def step_synchronous(self, *, lr: float, weight_decay: float) -> StepStats:
        """Baseline: all-gather every gradient, update every matrix on every rank, keep own shard."""
        stats = StepStats()
        local = torch.cat([m.shard_grad().reshape(-1) for m in self.matrices])
        gathered = local.new_empty(self.world_size * local.numel())
        dist.all_gather_single(gathered, local, group=self.group)
        stats.wire_bytes += ring_bytes(local.numel(), self.world_size, local.element_size())
        rows = gathered.view(self.world_size, local.numel())
        offset = 0
        for index, m in enumerate(self.matrices):
            numel = m.shard.numel()
            pieces = [rows[r, offset : offset + numel].view(m.shard.shape) for r in range(self.world_size)]
            offset += numel
            momentum = self.replicated_momentum.setdefault(index, m.shard.new_zeros(m.full_shape))
            with stats.computing():
                direction = muon_direction(torch.cat(pieces, dim=m.shard_dim), momentum, self.config)
            stats.updated_matrices += 1
            own = direction.chunk(self.world_size, dim=m.shard_dim)[self.rank]
            apply_direction(m.shard, own, lr=lr, weight_decay=weight_decay)
        return stats

    def _launch_gather(self, group: MicroGroup, stats: StepStats) -> _InFlight:
        send_parts, send_sizes = [], []
        for destination in range(self.world_size):
            hosted = [self.matrices[i] for i, h in zip(group.items, group.hosts, strict=True) if h == destination]
            send_parts += [m.shard_grad().reshape(-1) for m in hosted]
            send_sizes.append(sum(m.shard.numel() for m in hosted))
        mine = sum(
            self.matrices[i].shard.numel() for i, h in zip(group.items, group.hosts, strict=True) if h == self.rank
        )
        send = torch.cat(send_parts)
        received = send.new_empty(mine * self.world_size)
        work = dist.all_to_all_single(
            received, send, [mine] * self.world_size, send_sizes, group=self.group, async_op=True
        )
        stats.wire_bytes += (send.numel() - send_sizes[self.rank]) * send.element_size()
        return _InFlight(group, received, work)

    def _compute_hosted(self, gathered: _InFlight, stats: StepStats) -> list[Tensor]:
        """Full-matrix directions of the matrices this rank hosts, in group order."""
        hosted = [i for i, h in zip(gathered.group.items, gathered.group.hosts, strict=True) if h == self.rank]
        per_source = sum(self.matrices[i].shard.numel() for i in hosted)
        rows = gathered.received.view(self.world_size, per_source)
        directions, offset = [], 0
        for item in hosted:
            m = self.matrices[item]
            pieces = [rows[r, offset : offset + m.shard.numel()].view(m.shard.shape) for r in range(self.world_size)]
            offset += m.shard.numel()
            with stats.computing():
                directions.append(
                    muon_direction(torch.cat(pieces, dim=m.shard_dim), self.host_momentum[item], self.config)
                )
            stats.updated_matrices += 1
        return directions

    def _launch_scatter(self, group: MicroGroup, directions: list[Tensor], stats: StepStats) -> _InFlight:
        hosted = [i for i, h in zip(group.items, group.hosts, strict=True) if h == self.rank]
        send_parts = []
        for destination in range(self.world_size):
            for item, direction in zip(hosted, directions, strict=True):
                m = self.matrices[item]
                piece = direction.chunk(self.world_size, dim=m.shard_dim)[destination]
                send_parts.append(piece.to(m.shard.dtype).reshape(-1))
        per_destination = sum(self.matrices[i].shard.numel() for i in hosted)
        receive_sizes = [
            sum(self.matrices[i].shard.numel() for i, h in zip(group.items, group.hosts, strict=True) if h == source)
            for source in range(self.world_size)
        ]
        reference = self.matrices[group.items[0]].shard
        send = torch.cat(send_parts) if send_parts else reference.new_empty(0)
        received = reference.new_empty(sum(receive_sizes))
        work = dist.all_to_all_single(
            received, send, receive_sizes, [per_destination] * self.world_size, group=self.group, async_op=True
        )
        stats.wire_bytes += per_destination * (self.world_size - 1) * send.element_size()
        return _InFlight(group, received, work)

    def _apply(self, scattered: _InFlight, lr: float, weight_decay: float) -> None:
        scattered.work.wait()
        offset = 0
        for source in range(self.world_size):
            for item, host in zip(scattered.group.items, scattered.group.hosts, strict=True):
                if host != source:
                    continue
                m = self.matrices[item]
                piece = scattered.received[offset : offset + m.shard.numel()].view(m.shard.shape)
                offset += m.shard.numel()
                apply_direction(m.shard, piece, lr=lr, weight_decay=weight_decay)
