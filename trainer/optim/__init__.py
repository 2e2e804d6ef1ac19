"""Optimizers for Cantata training: Muon and Canzona's load-balanced distributed Muon.

The training loop uses `build_optimizer`; `merge_optimizer_shards` reshards a
checkpoint to a different data-parallel world size.
"""

from .checkpoint import ShardSetError, merge_optimizer_shards
from .muon import Muon, MuonConfig
from .training import OPTIMIZERS, TrainingOptimizer, build_optimizer

__all__ = [
    "OPTIMIZERS",
    "Muon",
    "MuonConfig",
    "ShardSetError",
    "TrainingOptimizer",
    "build_optimizer",
    "merge_optimizer_shards",
]
