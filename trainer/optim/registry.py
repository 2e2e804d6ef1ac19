"""The optimizer registry: each optimizer a job may name (the job field ``optimizer``), registered once.

Every optimizer steps the parameters its routing gives AdamW with AdamW; an
optimizer with a matrix step (Muon) also builds, from :class:`MatrixSettings`,
the object that updates the hidden matrices and owns their synchronisation.
:class:`~cantata.trainer.optim.training.TrainingOptimizer` asks :func:`kind_of`;
tests/test_optim_registry.py checks the registry against the job field's values
(:class:`cantata.proto.vocabulary.Optimizer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh

from cantata.proto.vocabulary import Optimizer

from .dp import DataParallelMuon
from .muon import MuonConfig
from .profiling import StepStats
from .routing import ParameterRouting
from .sharded import ShardedMuon


class MatrixStep(Protocol):
    """What updates the hidden matrices (``routing.muon``) after their gradients are in."""

    @property
    def params(self) -> list[Tensor]: ...

    owned: list[int]  # the matrices this rank updates

    def step(self, *, lr: float, weight_decay: float) -> StepStats: ...

    def rank_flops(self) -> list[float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class MatrixSettings:
    """What a matrix step is built from: the routed matrices, where they live, the job's settings."""

    routing: ParameterRouting
    process_group: dist.ProcessGroup | None  # a replicated model's data-parallel group
    mesh: DeviceMesh | None  # a sharded model's mesh
    tp_dim: str | None
    alpha: float
    bucket_elements: int
    cost_unit: str
    config: MuonConfig


@dataclass(frozen=True)
class OptimizerKind:
    name: str
    matrices: Callable[[MatrixSettings], MatrixStep] | None = None  # None: AdamW steps every parameter


OPTIMIZERS: dict[str, OptimizerKind] = {}


def register(kind: OptimizerKind) -> OptimizerKind:
    """Add ``kind``; a name taken already is refused."""
    if kind.name in OPTIMIZERS:
        raise ValueError(f"optimizer {kind.name!r} is registered already")
    OPTIMIZERS[kind.name] = kind
    return kind


def kind_of(name: str) -> OptimizerKind:
    """The optimizer registered as ``name``."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {tuple(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def _muon(s: MatrixSettings) -> MatrixStep:
    """Canzona's load-balanced Muon: on DTensors over a mesh, or data parallel over a process group."""
    if s.mesh is not None:
        return ShardedMuon(
            s.routing.muon,
            mesh=s.mesh,
            tp_dim=s.tp_dim,
            alpha=s.alpha,
            bucket_elements=s.bucket_elements,
            cost_unit=s.cost_unit,
            config=s.config,
            splits=s.routing.splits,
        )
    return DataParallelMuon(
        s.routing.muon,
        process_group=s.process_group,
        alpha=s.alpha,
        bucket_elements=s.bucket_elements,
        cost_unit=s.cost_unit,
        config=s.config,
        splits=s.routing.splits,
    )


register(OptimizerKind(Optimizer.ADAMW.value))
register(OptimizerKind(Optimizer.MUON.value, _muon))
