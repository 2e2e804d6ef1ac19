"""The optimizer object the training loop drives: AdamW or Muon (:mod:`.registry`), single process, data parallel or on a mesh.

With a process group (replicated model) the optimizer owns gradient
synchronisation: "adamw" all-reduces (averages) every gradient like DDP; "muon"
averages the AdamW-routed gradients the same way and runs DP-Canzona for the
hidden matrices. Clipping (``grad_clip``) needs the norm of the averaged
gradient, so with it set every gradient is averaged first (DP-Canzona's reduce
of equal gradients then changes nothing) and the global norm is clipped on every
rank alike.

With a device mesh (a model sharded by ``fully_shard`` and ``parallelize_module``)
FSDP2 has already averaged the gradients: "muon" runs Canzona on DTensor
(`ShardedMuon`) for the hidden matrices and AdamW updates the rest shard by shard.

A parameter that received no gradient on any rank is not stepped: no momentum,
no weight decay (as torch's AdamW and Muon skip a ``None`` gradient).

AdamW steps all its tensors at once: with the fused kernel on GPUs, with the
foreach (multi-tensor) one on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from cantata.proto.jobfields import server_default

from .cost import COST_UNITS
from .dp import received_gradients
from .muon import MUON_DEFAULTS, NS_DTYPES, MuonConfig
from .partition import max_over_mean
from .profiling import StepStats, ring_bytes
from .registry import MatrixSettings, MatrixStep, kind_of
from .routing import DEFAULT_ADAMW_PATTERNS, ParameterRouting, route_parameters

STATE_FORMAT = "cantata.training-optimizer/1"


class TrainingOptimizer:
    """step() after loss.backward(); afterwards every rank holds identical parameters."""

    def __init__(
        self,
        name: str,
        routing: ParameterRouting,
        *,
        lr: float,
        weight_decay: float,
        process_group: dist.ProcessGroup | None,
        alpha: float,
        bucket_elements: int,
        muon_config: MuonConfig,
        grad_clip: float = 0.0,
        cost_unit: str = "flops",
        mesh: DeviceMesh | None = None,
        tp_dim: str | None = None,
        clip_group: dist.ProcessGroup | None = None,
    ) -> None:
        kind = kind_of(name)
        if cost_unit not in COST_UNITS:
            raise ValueError(f"cost unit must be one of {COST_UNITS}, got {cost_unit!r}")
        if mesh is not None and process_group is not None:
            raise ValueError("give a process group (replicated model) or a device mesh (sharded model), not both")
        self.name = name
        self.mesh = mesh
        self.group = process_group
        self.muon: MatrixStep | None = None
        if mesh is not None:
            self.world_size, self.rank = mesh.size(), mesh.get_rank()
        else:
            self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
            self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.lr = lr
        self.weight_decay = weight_decay
        self.grad_clip = grad_clip
        self.clip_group = clip_group  # a pipeline's ranks: each holds other parameters, the norm is over all
        self.last_grad_norm: float | None = None  # before clipping, when grad_clip is set
        self.steps = 0
        self.last_stats = StepStats()
        self._window, self._window_steps, self._window_seconds = StepStats(), 0, 0.0  # since window_metrics()
        self._stats_group = process_group if mesh is None else _flat_group(mesh)
        elementwise = list(routing.adamw) if kind.matrices else list(routing.muon + routing.adamw)
        self._synced_params = [param for _, param in elementwise]
        self._all_params = [param for _, param in routing.muon + routing.adamw]
        fused = _fused(elementwise)
        self.adamw = torch.optim.AdamW(_adamw_groups(elementwise, weight_decay), lr=lr, fused=fused, foreach=not fused)
        if kind.matrices is not None:
            settings = MatrixSettings(
                routing, process_group, mesh, tp_dim, alpha, bucket_elements, cost_unit, muon_config
            )
            self.muon = kind.matrices(settings)  # the matrix step (Muon's; the name stays in checkpoints)

    @torch.no_grad()
    def step(self) -> StepStats:
        began = time.perf_counter()
        stats = StepStats()
        if self.world_size > 1 and self.mesh is None:
            self._all_reduce_mean(self._all_params if self.grad_clip else self._synced_params, stats)
        if self.grad_clip:
            params = [p for p in self._all_params if p.grad is not None]
            self.last_grad_norm = clip_global_norm(params, self.grad_clip, self.clip_group)
        if self.muon is not None:
            stats.add(self.muon.step(lr=self.lr, weight_decay=self.weight_decay))
        self.adamw.step()
        self.steps += 1
        self.last_stats = stats
        self._window.add(stats)
        self._window_steps += 1
        self._window_seconds += time.perf_counter() - began
        return stats

    def window_metrics(self) -> dict[str, float]:
        """The steps since the last call, over every rank of the optimizer's group, as the job's metrics.

        Collective (one small all-gather): every rank calls it at the same step. Per step:
        ``optim_step_s`` is the slowest rank's wall time in ``step()`` and ``optim_sent_bytes`` what
        all ranks send. Muon adds ``optim_compute_s`` (the slowest rank's Newton-Schulz time),
        ``optim_compute_imbalance`` (its max/mean over ranks), the plan's
        ``optim_ns_flops_imbalance`` (max/mean Newton-Schulz FLOPs owned per rank),
        ``optim_owned_matrices`` (the most one rank owns) and ``optim_updated_matrices`` (matrices the
        last step updated, those with no gradient left out).
        """
        steps = max(self._window_steps, 1)
        window = self._window
        owned = float(len(self.muon.owned)) if self.muon is not None else 0.0
        mine = torch.tensor(
            [
                self._window_seconds / steps,
                window.compute_seconds / steps,
                window.wire_bytes / steps,
                owned,
                float(self.last_stats.updated_matrices),
            ],
            dtype=torch.float64,
            device=self._all_params[0].device if self._all_params else None,
        )
        rows = mine[None]
        if self._stats_group is not None and self.world_size > 1:
            gathered = mine.new_empty(self.world_size * mine.numel())
            dist.all_gather_single(gathered, mine, group=self._stats_group)
            rows = gathered.view(self.world_size, mine.numel())
        rows = rows.cpu()
        self._window, self._window_steps, self._window_seconds = StepStats(), 0, 0.0
        metrics = {"optim_step_s": float(rows[:, 0].max()), "optim_sent_bytes": float(rows[:, 2].sum())}
        if self.muon is not None:
            compute = rows[:, 1]
            metrics |= {
                "optim_compute_s": float(compute.max()),
                "optim_compute_imbalance": max_over_mean(compute.tolist()),
                "optim_ns_flops_imbalance": max_over_mean(self.muon.rank_flops()),
                "optim_owned_matrices": float(rows[:, 3].max()),
                "optim_updated_matrices": float(rows[:, 4].sum()),
            }
        return metrics

    def zero_grad(self) -> None:
        self.adamw.zero_grad(set_to_none=True)
        if self.muon is not None:
            for param in self.muon.params:
                param.grad = None

    def set_lr(self, lr: float) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        self.lr = lr
        for group in self.adamw.param_groups:
            group["lr"] = lr

    def state_dict(self) -> dict:
        """This rank's state (only tensors, numbers, strings, lists, dicts and None)."""
        state = {
            "format": STATE_FORMAT,
            "name": self.name,
            "world_size": self.world_size,
            "rank": self.rank,
            "step": self.steps,
            "lr": self.lr,
            "adamw": _plain(self.adamw.state_dict()),
        }
        if self.muon is not None:
            state["muon"] = self.muon.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Load this rank's own shard, or a state merged by `merge_optimizer_shards` (any world size)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a training-optimizer state (format {state.get('format')!r})")
        if state["name"] != self.name:
            raise ValueError(f"state is for optimizer {state['name']!r}, this is {self.name!r}")
        if state["world_size"] != self.world_size and state["rank"] is not None:
            raise ValueError(
                f"shard of rank {state['rank']} of {state['world_size']} cannot load into {self.world_size} ranks; "
                "merge every shard with merge_optimizer_shards first"
            )
        self.adamw.load_state_dict(state["adamw"])
        if self.muon is not None:
            self.muon.load_state_dict(state["muon"])
        self.steps = state["step"]
        self.set_lr(state["lr"])

    def _all_reduce_mean(self, params: Sequence[Tensor], stats: StepStats) -> None:
        """Average the gradients of the parameters that received one on some rank; the others stay None."""
        params = [p for p, received in zip(params, received_gradients(params, self.group), strict=True) if received]
        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        stats.wire_bytes += 2 * ring_bytes(-(-flat.numel() // self.world_size), self.world_size, flat.element_size())
        stats.collective_elements += flat.numel()
        offset = 0
        for param in params:
            param.grad = flat[offset : offset + param.numel()].view_as(param).clone()
            offset += param.numel()


def build_optimizer(
    model: nn.Module,
    name: str,
    *,
    lr: float,
    weight_decay: float = server_default("weight_decay"),
    process_group: dist.ProcessGroup | None = None,
    alpha: float = MUON_DEFAULTS["canzona_alpha"],
    bucket_elements: int = MUON_DEFAULTS["canzona_bucket_elements"],
    cost_unit: str = MUON_DEFAULTS["canzona_cost_unit"],
    muon_config: MuonConfig = MuonConfig(),
    grad_clip: float = 0.0,
    muon_patterns: tuple[str, ...] = (),
    adamw_patterns: tuple[str, ...] = DEFAULT_ADAMW_PATTERNS,
    splits: Mapping[str, Sequence[int]] | None = None,
    mesh: DeviceMesh | None = None,
    tp_dim: str | None = None,
    clip_group: dist.ProcessGroup | None = None,
) -> TrainingOptimizer:
    """AdamW or Muon (hidden matrices; AdamW for the rest) for `model`.

    A replicated model is data parallel over `process_group`; a model sharded with `fully_shard`
    (and `parallelize_module` on the mesh dim `tp_dim`) gives its `mesh` instead. Name patterns
    (fnmatch) override the routing rule and `splits` declares fused projections (added to the
    model's `muon_splits`); see `route_parameters`. `grad_clip` > 0 clips the global norm of the
    (averaged) gradients to it; over the parameters of every rank of `clip_group` (a pipeline's) too.
    """
    return TrainingOptimizer(
        name,
        route_parameters(model, muon_patterns=muon_patterns, adamw_patterns=adamw_patterns, splits=splits),
        lr=lr,
        weight_decay=weight_decay,
        process_group=process_group,
        alpha=alpha,
        bucket_elements=bucket_elements,
        muon_config=muon_config,
        grad_clip=grad_clip,
        cost_unit=cost_unit,
        mesh=mesh,
        tp_dim=tp_dim,
        clip_group=clip_group,
    )


def clip_global_norm(params: Sequence[Tensor], max_norm: float, group: dist.ProcessGroup | None = None) -> float:
    """Scale the gradients so that their global norm is at most ``max_norm``; returns the norm before.

    Sharded (DTensor) gradients may live on different meshes (FSDP's data-parallel one, FSDP and
    tensor parallelism's 2-D one), which ``clip_grad_norm_`` cannot stack: each one's squared norm
    is reduced over its own mesh first; with ``group`` (each rank holding other parameters) the
    squares are summed over its ranks.
    """
    total = torch.zeros(())
    for param in params:
        square = torch.linalg.vector_norm(param.grad) ** 2
        total += square.full_tensor() if isinstance(square, DTensor) else square
    if group is not None:
        dist.all_reduce(total, group=group)
    norm = float(total.sqrt())
    scale = max_norm / (norm + 1e-6)
    if scale < 1:
        for param in params:
            assert param.grad is not None
            param.grad.mul_(scale)
    return norm


def _flat_group(mesh: DeviceMesh) -> dist.ProcessGroup:
    """The process group of every rank of `mesh`."""
    return mesh.get_group() if mesh.ndim == 1 else mesh._flatten().get_group()


def _fused(named_params: Sequence[tuple[str, Tensor]]) -> bool:
    """Whether AdamW takes its fused kernel (parameters on GPUs); else its foreach form, alike to 1e-6 on the CPU."""
    return bool(named_params) and all(p.device.type == "cuda" for _, p in named_params)


def _adamw_groups(named_params: Sequence[tuple[str, Tensor]], weight_decay: float) -> list[dict]:
    """Matrices (embeddings, head) decay; vectors (norms, biases) do not."""
    decayed = [p for _, p in named_params if p.ndim >= 2]
    plain = [p for _, p in named_params if p.ndim < 2]
    return [
        {"params": decayed, "weight_decay": weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]


def _plain(value):
    """Tuples become lists so the state loads with torch.load(weights_only=True) on any version."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def spec_settings(spec) -> dict:
    """`build_optimizer`'s Muon and Canzona keywords from a parsed `JobSpec` (an unset field: the default)."""
    momentum = spec.muon_momentum if spec.HasField("muon_momentum") else MuonConfig.momentum
    return {
        "alpha": spec.canzona_alpha if spec.HasField("canzona_alpha") else MUON_DEFAULTS["canzona_alpha"],
        "bucket_elements": spec.canzona_bucket_elements or MUON_DEFAULTS["canzona_bucket_elements"],
        "cost_unit": spec.canzona_cost_unit or MUON_DEFAULTS["canzona_cost_unit"],
        "muon_config": MuonConfig(
            momentum=momentum,
            ns_steps=spec.muon_ns_steps or MuonConfig.ns_steps,
            ns_dtype=NS_DTYPES[spec.muon_ns_dtype or MUON_DEFAULTS["muon_ns_dtype"]],
        ),
    }
