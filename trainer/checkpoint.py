"""A job's checkpoints as its workers write and read them: sealed, in the job's blob store.

:class:`TrainingState` is the one registry of what a checkpoint holds: the
lead rank seals the model (and a decentralized worker's outer state), every
rank its own optimizer shard, then the lead commits the manifest that makes
the checkpoint exist (see ``cantata.security.sealed_checkpoint``). Every
process seals its data position beside the checkpoint, unlisted, since in
decentralized training one worker group commits for all. The worker
holds only its job's derived keys, handed over by the server in its 0600
config file.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

import torch.distributed as dist

from cantata.security.keys import JobKeys
from cantata.security.sealed_checkpoint import (
    ShardInfo,
    begin_checkpoint,
    commit_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    read_unlisted_shard,
    write_shard,
)
from cantata.storage import open_store


class _Where(TypedDict):
    """Whose checkpoints: every sealed-checkpoint call takes these."""

    tenant: str
    job_id: str


class JobCheckpoints:
    def __init__(self, store_uri: str, tenant: str, job_id: str, keys: JobKeys, keep_last: int):
        """``keep_last``: the newest checkpoints kept; older ones are deleted once a newer manifest is written."""
        self._store = open_store(store_uri)
        self._keep_last = keep_last
        self._where: _Where = {"tenant": tenant, "job_id": job_id}
        self._keys = keys

    def latest_step(self) -> int | None:
        """The newest checkpoint whose manifest verifies, or None."""
        info = latest_checkpoint(self._store, keys=self._keys, **self._where)
        return info.step if info else None

    def load(self, step: int) -> dict:
        """Every shard of checkpoint ``step``, verified before anything is deserialised."""
        return load_checkpoint(self._store, step=step, keys=self._keys, **self._where)

    def save(self, step: int, rank: int, shards: dict[str, dict], group) -> int | None:
        """Seal this rank's ``shards``; the lead rank commits. Returns the committed size on the lead."""
        if rank == 0:
            begin_checkpoint(self._store, step=step, **self._where)
        if group is not None:
            dist.barrier(group)
        infos = [
            write_shard(self._store, step=step, name=name, state=state, kek=self._keys.current, **self._where)
            for name, state in shards.items()
        ]
        if group is not None:
            gathered: list[list[ShardInfo]] | None = (
                [[] for _ in range(dist.get_world_size(group))] if rank == 0 else None
            )
            dist.gather_object(infos, gathered, dst=0, group=group)
            infos = [info for rank_infos in (gathered or []) for info in rank_infos]
        if rank != 0:
            return None
        commit_checkpoint(
            self._store, step=step, shards=infos, kek=self._keys.current, keep_last=self._keep_last, **self._where
        )
        return sum(info.sealed_size for info in infos)

    def save_beside(self, step: int, name: str, state: dict) -> None:
        """Seal ``state`` (plain JSON values) beside checkpoint ``step``, unlisted in its manifest."""
        write_shard(
            self._store, step=step, name=name, state=json.dumps(state).encode(), kek=self._keys.current, **self._where
        )

    def load_beside(self, step: int, name: str) -> dict | None:
        """What :meth:`save_beside` sealed as ``name`` at ``step``, or None if nothing was."""
        raw = read_unlisted_shard(self._store, step=step, name=name, keys=self._keys, **self._where)
        return None if raw is None else json.loads(raw)


class Scope(enum.Enum):
    """Who seals a part of the training state, and under which shard name."""

    LEAD = "lead"  # rank 0 of the committing group, listed as ``name``
    RANK = "rank"  # every rank of the committing group, listed as ``name-RANK``
    PROCESS = "process"  # every process of the job, sealed beside the checkpoint as ``name-PROCESS`` (JSON)


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


@dataclass(frozen=True)
class Part:
    name: str
    scope: Scope
    holder: Stateful


class TrainingState:
    """The registry of checkpointed state: every part is saved and restored the same way.

    The trainer registers the model, the optimizer and the data position; a
    strategy adds its own (the decentralized outer state). Only the ranks of
    the committing group (every rank of an all-reduce job, worker group 0 of
    a decentralized one) seal listed parts; ``PROCESS`` parts are sealed by
    every process before the commit, so a checkpoint's own ranks always find
    theirs.
    """

    def __init__(self, checkpoints: JobCheckpoints, *, rank: int, process: int, group, commits: bool):
        self._checkpoints, self._rank, self._process, self._group = checkpoints, rank, process, group
        self._commits = commits
        self._parts: list[Part] = []
        self._listed: dict[str, Any] = {}

    def register(self, name: str, scope: Scope, holder: Stateful) -> None:
        if any(part.name == name for part in self._parts):
            raise ValueError(f"a part named {name!r} is already registered")
        self._parts.append(Part(name, scope, holder))

    def shard_name(self, part: Part) -> str:
        return {Scope.LEAD: part.name, Scope.RANK: f"{part.name}-{self._rank}"}.get(
            part.scope, f"{part.name}-{self._process}"
        )

    def latest_step(self) -> int:
        """The newest verified checkpoint's step (0 if none), as rank 0 of the group sees it."""
        return share_from_rank0(self._checkpoints.latest_step() or 0, self._group)

    def restore(self, step: int) -> None:
        """Load every listed part of checkpoint ``step`` (the ``PROCESS`` parts: :meth:`restore_beside`)."""
        self._listed = self._checkpoints.load(step)
        for part in self._parts:
            if part.scope is not Scope.PROCESS:
                part.holder.load_state_dict(self._listed[self.shard_name(part)])

    def restore_beside(self, step: int) -> bool:
        """Load the ``PROCESS`` parts this process sealed at ``step``; False (nothing loaded) if one is missing."""
        states = {}
        for part in self._parts:
            if part.scope is Scope.PROCESS:
                name = self.shard_name(part)
                state = self._listed.get(name)  # listed by checkpoints older than this registry
                states[part.name] = state if state is not None else self._checkpoints.load_beside(step, name)
        if any(state is None for state in states.values()):
            return False
        for part in self._parts:
            if part.scope is Scope.PROCESS:
                part.holder.load_state_dict(states[part.name])
        return True

    def save(self, step: int) -> int | None:
        """Seal this process's parts at ``step``; returns the committed size on the lead, else None."""
        for part in self._parts:
            if part.scope is Scope.PROCESS:
                self._checkpoints.save_beside(step, self.shard_name(part), part.holder.state_dict())
        if not self._commits:
            return None
        listed = [part for part in self._parts if part.scope is not Scope.PROCESS]
        states = [part.holder.state_dict() for part in listed]  # on every rank: a sharded model's is collective
        shards = {
            self.shard_name(part): state
            for part, state in zip(listed, states, strict=True)
            if part.scope is Scope.RANK or self._rank == 0
        }
        return self._checkpoints.save(step, self._rank, shards, self._group)


def share_from_rank0(value: int, group: dist.ProcessGroup | None) -> int:
    """Rank 0's ``value`` on every rank of ``group``."""
    if group is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
