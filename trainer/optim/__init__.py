"""Optimizers for Cantata training: Muon and Canzona's load-balanced distributed Muon.

The training loop uses `build_optimizer` (with `spec_settings(spec)` for a job's Muon and
Canzona fields; `mesh=` for a model sharded with FSDP2 and tensor parallelism); `merge_optimizer_shards` reshards a
checkpoint to a different data-parallel world size.
"""

from .checkpoint import ShardSetError, merge_optimizer_shards
from .muon import Muon, MuonConfig
from .registry import OPTIMIZERS, OptimizerKind, kind_of, register
from .sharded import ShardedMuon
from .training import TrainingOptimizer, build_optimizer, spec_settings

__all__ = [
    "OPTIMIZERS",
    "Muon",
    "MuonConfig",
    "OptimizerKind",
    "ShardSetError",
    "ShardedMuon",
    "TrainingOptimizer",
    "build_optimizer",
    "kind_of",
    "merge_optimizer_shards",
    "register",
    "spec_settings",
]
