"""Canzona on DTensor: Muon for parameters sharded by FSDP2 (`fully_shard`) and tensor parallelism.

Every matrix (or fused projection, or stack of expert matrices) gets one owner
rank of the device mesh. The owner's data-parallel coordinate comes from
Canzona's alpha-balanced plan over the data-parallel ranks; its
tensor-parallel coordinate comes from the micro-group packing over the TP
ranks (greedy rollback, LPT hosts). The stages of the pipeline are the
micro-groups: one `all_to_all_single` with exact split sizes sends every rank's
gradient piece to the owners, the owners run momentum and Newton-Schulz once on
the whole matrix, and a second `all_to_all_single` sends each rank its piece of
the update. Stage i+1 is gathered while stage i computes, and stage i-1 is
applied once stage i's scatter is under way. Each collective moves exactly the
gradient's (or update's) elements: nothing is padded.

A parameter's piece on a rank is worked out from its placements (`Shard`,
FSDP2's `_StridedShard` under TP, `Replicate`); only one replica of a
replicated piece sends it. Momentum lives on the owner only, as whole matrices;
`state_dict()` hands every rank its piece as a DTensor placed like the
parameter, so `torch.distributed.checkpoint` saves and reshards it with the
model, and `load_state_dict` sends the pieces back to the (new) owners.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from .buckets import build_buckets
from .cost import update_cost
from .muon import MUON_DEFAULTS, MuonConfig, apply_direction, check_splits, muon_direction
from .partition import ShardingPlan, alpha_balanced_plan
from .profiling import StepStats
from .tp import greedy_rollback_groups

Box = tuple[slice, ...]
SHARDED_STATE_FORMAT = "cantata.canzona-dtensor/1"


@dataclass(frozen=True)
class _Item:
    """One Muon parameter: its pieces on every rank of the mesh (flat order), and its owner."""

    name: str
    param: Tensor
    full_shape: tuple[int, ...]
    splits: tuple[int, ...]
    boxes: tuple[Box, ...]  # the region of the full tensor each rank holds
    senders: tuple[bool, ...]  # whether each rank sends its piece (one replica of each piece does)

    def numel(self, rank: int) -> int:
        return math.prod(s.stop - s.start for s in self.boxes[rank])


def piece_box(shape: Sequence[int], mesh_shape: Sequence[int], coordinate: Sequence[int], placements) -> Box:
    """The region of a tensor of `shape` that the rank at `coordinate` holds.

    Shards split like `torch.chunk` (the last pieces may be short or empty). Plain shards apply
    in mesh order; FSDP2's strided shard splits the piece left by the shards after it.
    """
    bounds = [(0, size) for size in shape]
    order = [i for i, p in enumerate(placements) if not isinstance(p, _StridedShard)]
    order += [i for i in reversed(range(len(placements))) if isinstance(placements[i], _StridedShard)]
    for index in order:
        placement = placements[index]
        if isinstance(placement, Replicate):
            continue
        if not isinstance(placement, (Shard, _StridedShard)):
            raise ValueError(f"Muon cannot update a parameter placed as {placement}")
        low, high = bounds[placement.dim]
        chunk = -(-(high - low) // mesh_shape[index])
        start = min(high, low + coordinate[index] * chunk)
        bounds[placement.dim] = (start, min(high, start + chunk))
    return tuple(slice(low, high) for low, high in bounds)


class ShardedMuon:
    """Muon over the ranks of `mesh` for DTensor (or replicated plain) parameters.

    `mesh` is the training mesh (e.g. dims ("dp_shard", "tp")); a parameter may live on a named
    sub-mesh of it (FSDP-only layers live on the data-parallel dims). `tp_dim` names the
    tensor-parallel dim, if any; the other dims are data parallel. Every rank of the mesh must
    construct it with the same parameters in the same order. `splits` maps a parameter name to the
    row counts of its fused sub-matrices. `plan` replaces the alpha-balanced data-parallel ownership
    (e.g. the layer-wise baseline); `capacity` is the micro-groups' (default: the largest cost).
    """

    def __init__(
        self,
        named_params: Sequence[tuple[str, Tensor]],
        *,
        mesh: DeviceMesh | None,
        tp_dim: str | None = None,
        alpha: float = 1.0,
        bucket_elements: int = MUON_DEFAULTS["canzona_bucket_elements"],
        cost_unit: str = MUON_DEFAULTS["canzona_cost_unit"],
        config: MuonConfig = MuonConfig(),
        splits: Mapping[str, tuple[int, ...]] | None = None,
        capacity: float | None = None,
        plan: ShardingPlan | None = None,
    ) -> None:
        self.config = config
        self.mesh = mesh
        mesh_shape = tuple(mesh.shape) if mesh is not None else (1,)
        names = tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
        if tp_dim is not None and tp_dim not in names:
            raise ValueError(f"tp_dim {tp_dim!r} is not a dim of the mesh {names}")
        self.world_size = math.prod(mesh_shape)
        if mesh is None:
            self.group, self.rank = None, 0
        else:
            self.group = mesh.get_group() if mesh.ndim == 1 else mesh._flatten().get_group()
            self.rank = dist.get_rank(self.group)
        coordinates = [_unravel(rank, mesh_shape) for rank in range(self.world_size)]
        if mesh is not None and tuple(mesh.get_coordinate() or ()) != coordinates[self.rank]:
            raise RuntimeError(
                f"rank {self.rank} of the flattened mesh is not at mesh coordinate {mesh.get_coordinate()}"
            )
        self.items = [
            _item(name, param, (splits or {}).get(name, ()), mesh, names, mesh_shape, coordinates, self.rank)
            for name, param in named_params
        ]
        costs = [
            update_cost(i.full_shape, unit=cost_unit, splits=i.splits, ns_steps=config.ns_steps) for i in self.items
        ]
        tp_index = names.index(tp_dim) if tp_dim is not None else None
        tp_size = mesh_shape[tp_index] if tp_index is not None else 1
        dp_size = self.world_size // tp_size
        numels = [math.prod(i.full_shape) for i in self.items]
        if plan is None:
            plan = alpha_balanced_plan(build_buckets(numels, bucket_elements), costs, dp_size, alpha)
        if plan.world_size != dp_size:
            raise ValueError(f"plan is for {plan.world_size} data-parallel ranks, the mesh has {dp_size}")
        self.plan = plan
        dp_owner = plan.owner_by_param()
        rank_of = {}
        for rank, coordinate in enumerate(coordinates):
            dp_coordinate = tuple(c for d, c in enumerate(coordinate) if d != tp_index)
            dp_shape = tuple(s for d, s in enumerate(mesh_shape) if d != tp_index)
            tp_coordinate = coordinate[tp_index] if tp_index is not None else 0
            rank_of[(_ravel(dp_coordinate, dp_shape), tp_coordinate)] = rank
        self.capacity = capacity if capacity is not None else max(costs, default=0.0)
        per_dp_owner = [[i for i in range(len(self.items)) if dp_owner[i] == d] for d in range(dp_size)]
        stages: list[list[tuple[int, int]]] = []
        for d, items in enumerate(per_dp_owner):
            groups = greedy_rollback_groups([costs[i] for i in items], tp_size, self.capacity)
            for index, group in enumerate(groups):
                if index == len(stages):
                    stages.append([])
                stages[index] += [
                    (items[k], rank_of[(d, host)]) for k, host in zip(group.items, group.hosts, strict=True)
                ]
        self.stages = [tuple(stage) for stage in stages]
        self.owner = {item: owner for stage in self.stages for item, owner in stage}
        self.owned = sorted(i for i, owner in self.owner.items() if owner == self.rank)
        self.momentum = {i: _local(self.items[i].param).new_zeros(self.items[i].full_shape) for i in self.owned}

    @property
    def names(self) -> list[str]:
        return [item.name for item in self.items]

    @property
    def params(self) -> list[Tensor]:
        return [item.param for item in self.items]

    def rank_flops(self) -> list[float]:
        """Newton-Schulz FLOPs of the matrices each rank of the mesh owns (the plan's compute load)."""
        loads = [0.0] * self.world_size
        for index, owner in self.owner.items():
            item = self.items[index]
            loads[owner] += update_cost(
                item.full_shape, unit="flops", splits=item.splits, ns_steps=self.config.ns_steps
            )
        return loads

    @torch.no_grad()
    def step(self, *, lr: float, weight_decay: float) -> StepStats:
        """Update every matrix that received a gradient on some rank; leave the others untouched."""
        stats = StepStats()
        grads = [self._local_grad(item) for item in self.items]
        active = self._received(grads)
        pipeline = [tuple((i, o) for i, o in stage if active[i]) for stage in self.stages]
        pipeline = [stage for stage in pipeline if stage]
        if self.world_size == 1:
            for stage in pipeline:
                directions = self._compute({i: {0: self._grad_or_zeros(i, grads)} for i, _ in stage}, stats)
                for i, _ in stage:
                    apply_direction(_local(self.items[i].param), directions[i], lr=lr, weight_decay=weight_decay)
            return stats
        gathering = self._launch_gather(pipeline[0], grads, stats) if pipeline else None
        scattering = None
        for index, stage in enumerate(pipeline):
            current = gathering
            assert current is not None  # launched for this stage by the previous iteration
            gathering = self._launch_gather(pipeline[index + 1], grads, stats) if index + 1 < len(pipeline) else None
            directions = self._compute(self._receive_gather(stage, *current), stats)
            launched = self._launch_scatter(stage, directions, stats)
            if scattering is not None:
                self._apply(*scattering, lr=lr, weight_decay=weight_decay)
            scattering = (stage, *launched)
        if scattering is not None:
            self._apply(*scattering, lr=lr, weight_decay=weight_decay)
        return stats

    def state_dict(self) -> dict:
        """Momentum by parameter name, each a DTensor placed like its parameter (a plain tensor for a plain one).

        Collective: the owners send every rank its piece of their momentum (one exact-size
        ``all_to_all_single``), so ``torch.distributed.checkpoint`` saves and reshards it like the
        parameters, and ``full_tensor()`` gives the whole matrix.
        """
        pieces = self._scatter_momentum()
        momentum: dict[str, Tensor] = {}
        for index, item in enumerate(self.items):
            piece = pieces[index].view(_local(item.param).shape)
            if isinstance(item.param, DTensor):
                momentum[item.name] = DTensor.from_local(
                    piece,
                    item.param.device_mesh,
                    item.param.placements,
                    run_check=False,
                    shape=item.param.shape,
                    stride=item.param.stride(),
                )
            else:
                momentum[item.name] = piece
        return {"format": SHARDED_STATE_FORMAT, "momentum": momentum}

    def load_state_dict(self, state: dict) -> None:
        """Momentum from `state_dict()` of any mesh: DTensors (placed like the parameters, as
        ``torch.distributed.checkpoint`` loads them, or else gathered whole) or whole tensors.
        Collective: every rank's piece goes to the matrix's owner."""
        if state.get("format") != SHARDED_STATE_FORMAT:
            raise ValueError(f"not a Canzona-on-DTensor optimizer state (format {state.get('format')!r})")
        momentum = state["momentum"]
        missing = [item.name for item in self.items if item.name not in momentum]
        if missing:
            raise KeyError(f"optimizer state lacks momentum for {len(missing)} matrices (first: {missing[0]!r})")
        momentum_pieces: list[Tensor] = []
        for item in self.items:
            saved: Tensor = momentum[item.name]
            if tuple(saved.shape) != item.full_shape:
                raise ValueError(
                    f"momentum for {item.name!r} has shape {tuple(saved.shape)}, parameter has {item.full_shape}"
                )
            if (
                isinstance(saved, DTensor)
                and isinstance(item.param, DTensor)
                and (saved.device_mesh, saved.placements) == (item.param.device_mesh, item.param.placements)
            ):
                piece = saved.to_local()
            else:
                whole = saved.full_tensor() if isinstance(saved, DTensor) else saved
                piece = whole[item.boxes[self.rank]]
            momentum_pieces.append(piece.to(_local(item.param).device, _local(item.param).dtype).contiguous())
        stage = self._every_item()
        if not stage:
            return
        if self.world_size == 1:
            for i, _ in stage:
                self.momentum[i].copy_(momentum_pieces[i].view(self.items[i].full_shape))
            return
        gathered = self._receive_gather(stage, *self._launch_gather(stage, momentum_pieces, StepStats()))
        for index, by_source in gathered.items():
            for source, piece in by_source.items():
                box = self.items[index].boxes[source]
                self.momentum[index][box] = piece.view(self.momentum[index][box].shape)

    def _every_item(self) -> tuple[tuple[int, int], ...]:
        """Every matrix and its owner, as one stage of the pipeline (for moving optimizer state)."""
        return tuple(sorted(self.owner.items()))

    def _scatter_momentum(self) -> list[Tensor]:
        """This rank's piece of every matrix's momentum, flat, in item order."""
        stage = self._every_item()
        if self.world_size == 1 or not stage:
            return [self.momentum[i].reshape(-1).clone() for i, _ in stage]
        received, work = self._launch_scatter(
            stage, {i: self.momentum[i] for i, _ in stage if i in self.momentum}, StepStats()
        )
        pieces: list[Tensor] = [received.new_empty(0)] * len(self.items)
        for item, piece in self._received_pieces(stage, received, work):
            pieces[item] = piece.clone()
        return pieces

    def _local_grad(self, item: _Item) -> Tensor | None:
        grad = item.param.grad
        if isinstance(grad, DTensor):
            assert isinstance(item.param, DTensor)
            if tuple(grad.placements) != tuple(item.param.placements):
                grad = grad.redistribute(item.param.device_mesh, item.param.placements)
            return grad.to_local()
        return grad

    def _grad_or_zeros(self, item: int, grads: Sequence[Tensor | None]) -> Tensor:
        grad = grads[item]
        return grad if grad is not None else torch.zeros_like(_local(self.items[item].param))

    def _received(self, grads: Sequence[Tensor | None]) -> list[bool]:
        """Whether any rank holds a gradient of each matrix (one small all-reduce)."""
        flags = torch.tensor([grad is not None for grad in grads], dtype=torch.int32)
        if self.group is not None and self.world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(flag) for flag in flags]

    def _launch_gather(self, stage, grads, stats: StepStats) -> tuple[Tensor, dist.Work]:
        send_parts, send_sizes = [], []
        for destination in range(self.world_size):
            size = 0
            for item, owner in stage:
                if owner == destination and self.items[item].senders[self.rank]:
                    local = self._grad_or_zeros(item, grads)
                    send_parts.append(local.reshape(-1))
                    size += local.numel()
            send_sizes.append(size)
        receive_sizes = [
            sum(
                self.items[i].numel(source)
                for i, owner in stage
                if owner == self.rank and self.items[i].senders[source]
            )
            for source in range(self.world_size)
        ]
        return self._exchange(stage, send_parts, send_sizes, receive_sizes, stats)

    def _receive_gather(self, stage, received: Tensor, work: dist.Work) -> dict[int, dict[int, Tensor]]:
        """The gradient pieces of the matrices this rank owns in `stage`, by item and source rank."""
        work.wait()
        pieces: dict[int, dict[int, Tensor]] = {i: {} for i, owner in stage if owner == self.rank}
        offset = 0
        for source in range(self.world_size):
            for item in pieces:
                if self.items[item].senders[source]:
                    numel = self.items[item].numel(source)
                    pieces[item][source] = received[offset : offset + numel]
                    offset += numel
        return pieces

    def _compute(self, pieces: dict[int, dict[int, Tensor]], stats: StepStats) -> dict[int, Tensor]:
        directions = {}
        for item, by_source in pieces.items():
            entry = self.items[item]
            with stats.computing():
                full = self.momentum[item].new_empty(entry.full_shape)
                for source, piece in by_source.items():
                    box = entry.boxes[source]
                    full[box] = piece.view(full[box].shape)
                directions[item] = muon_direction(full, self.momentum[item], self.config, entry.splits)
            stats.updated_matrices += 1
        return directions

    def _launch_scatter(self, stage, directions: dict[int, Tensor], stats: StepStats) -> tuple[Tensor, dist.Work]:
        send_parts, send_sizes = [], []
        for destination in range(self.world_size):
            size = 0
            for item, direction in directions.items():
                piece = direction[self.items[item].boxes[destination]]
                send_parts.append(piece.to(_local(self.items[item].param).dtype).reshape(-1))
                size += piece.numel()
            send_sizes.append(size)
        receive_sizes = [
            sum(self.items[i].numel(self.rank) for i, owner in stage if owner == source)
            for source in range(self.world_size)
        ]
        return self._exchange(stage, send_parts, send_sizes, receive_sizes, stats)

    def _apply(self, stage, received: Tensor, work: dist.Work, *, lr: float, weight_decay: float) -> None:
        for item, piece in self._received_pieces(stage, received, work):
            local = _local(self.items[item].param)
            apply_direction(local, piece.view(local.shape), lr=lr, weight_decay=weight_decay)

    def _received_pieces(self, stage, received: Tensor, work: dist.Work):
        """(item, this rank's flat piece) of every matrix in `stage`, from a finished scatter."""
        work.wait()
        offset = 0
        for source in range(self.world_size):
            for item, owner in stage:
                if owner == source:
                    numel = self.items[item].numel(self.rank)
                    yield item, received[offset : offset + numel]
                    offset += numel

    def _exchange(self, stage, send_parts, send_sizes, receive_sizes, stats: StepStats) -> tuple[Tensor, dist.Work]:
        reference = _local(self.items[stage[0][0]].param)
        send = torch.cat(send_parts) if send_parts else reference.new_empty(0)
        received = reference.new_empty(sum(receive_sizes))
        work = dist.all_to_all_single(received, send, receive_sizes, send_sizes, group=self.group, async_op=True)
        assert work is not None  # async_op=True
        stats.wire_bytes += (send.numel() - send_sizes[self.rank]) * send.element_size()
        stats.collective_elements += send.numel()
        return received, work


def _local(param: Tensor) -> Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _item(name, param, splits, mesh, names, mesh_shape, coordinates, rank: int) -> _Item:
    full_shape = tuple(param.shape)
    check_splits(name, full_shape, tuple(splits))
    placements: list[Placement] = [Replicate()] * len(mesh_shape)
    if isinstance(param, DTensor):
        param_mesh = param.device_mesh
        if mesh is None:
            raise ValueError(f"{name!r} is a DTensor: give the training mesh")
        param_names = param_mesh.mesh_dim_names or ()
        if param_mesh == mesh:
            placements = list(param.placements)
        elif param_names and set(param_names) <= set(names):
            for dim_name, placement in zip(param_names, param.placements, strict=True):
                placements[names.index(dim_name)] = placement
        else:
            raise ValueError(f"{name!r} lives on mesh {param_mesh}, which is not a named part of {mesh}")
    boxes = tuple(piece_box(full_shape, mesh_shape, c, placements) for c in coordinates)
    expected = tuple(s.stop - s.start for s in boxes[rank])
    if expected != tuple(_local(param).shape):
        raise ValueError(
            f"{name!r}: local piece has shape {tuple(_local(param).shape)}, its placements give {expected}"
        )
    replicated = [d for d, p in enumerate(placements) if isinstance(p, Replicate)]
    senders = tuple(all(c[d] == 0 for d in replicated) for c in coordinates)
    return _Item(name, param, full_shape, tuple(splits), boxes, senders)


def _unravel(rank: int, shape: Sequence[int]) -> tuple[int, ...]:
    coordinate = []
    for size in reversed(shape):
        rank, c = divmod(rank, size)
        coordinate.append(c)
    return tuple(reversed(coordinate))


def _ravel(coordinate: Sequence[int], shape: Sequence[int]) -> int:
    index = 0
    for c, size in zip(coordinate, shape, strict=True):
        index = index * size + c
    return index
