"""Resharding of per-rank optimizer checkpoints to a different data-parallel world size.

Each rank saves only its own shard (`TrainingOptimizer.state_dict()`). To
resume on a different number of ranks, merge every saved shard once and give
the merged state to `load_state_dict` on each new rank: a rank takes the
momentum of the matrices its new plan assigns to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .dp import STATE_FORMAT as DP_STATE_FORMAT


class ShardSetError(ValueError):
    """The shards given do not form one complete checkpoint."""


def merge_optimizer_shards(shards: Sequence[dict]) -> dict:
    """Combine the per-rank states of one checkpoint into a state any world size can load."""
    if not shards:
        raise ShardSetError("no shards given")
    first = shards[0]
    for key in ("format", "name", "world_size", "step"):
        values = {repr(shard.get(key)) for shard in shards}
        if len(values) > 1:
            raise ShardSetError(f"shards disagree on {key!r}: {sorted(values)}")
    world_size = first["world_size"]
    ranks = sorted(shard["rank"] for shard in shards)
    if ranks != list(range(world_size)):
        raise ShardSetError(f"expected one shard per rank 0..{world_size - 1}, got ranks {ranks}")
    merged = {key: value for key, value in first.items() if key not in ("rank", "muon")}
    merged["rank"] = None
    if "muon" in first:
        momentum: dict = {}
        for shard in shards:
            dp_state = shard["muon"]
            if dp_state.get("format") != DP_STATE_FORMAT:
                raise ShardSetError(f"rank {shard['rank']} holds no DP-Canzona state")
            overlap = momentum.keys() & dp_state["momentum"].keys()
            if overlap:
                raise ShardSetError(f"matrices saved by more than one rank: {sorted(overlap)[:3]}")
            momentum.update(dp_state["momentum"])
        merged["muon"] = {"format": DP_STATE_FORMAT, "world_size": world_size, "rank": None, "momentum": momentum}
    return merged
