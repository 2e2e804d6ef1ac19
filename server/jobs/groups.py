"""How a job's worker processes form groups: how many there are, who shares a group, how many must live.

A job runs ``workers`` worker groups of ``ranks_per_worker`` processes each
(:func:`processes`). An all-reduce or single job is one ``torch.distributed``
group; a decentralized job (GASLoC, DiLoCo) has one per worker group, and
goes on while ``min_workers`` of them are alive (:func:`quorum`).
"""

from __future__ import annotations

from cantata.proto.v1 import common_pb2
from cantata.server.jobs.jobspec import DECENTRALIZED, processes

__all__ = ["decentralized", "group_size", "processes", "quorum"]


def decentralized(spec: common_pb2.JobSpec) -> bool:
    """True if the job's worker groups train apart and gossip (they can outlive each other)."""
    return spec.algorithm in DECENTRALIZED


def group_size(spec: common_pb2.JobSpec) -> int:
    """Processes per ``torch.distributed`` group: a decentralized worker group, or the whole job."""
    return spec.ranks_per_worker if decentralized(spec) else processes(spec)


def quorum(spec: common_pb2.JobSpec) -> int:
    """Worker processes a decentralized job needs alive: its ``min_workers`` worker groups (default a majority)."""
    return spec.min_workers * spec.ranks_per_worker
