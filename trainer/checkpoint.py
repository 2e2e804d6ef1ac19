"""A job's checkpoints as its workers write and read them: sealed, in the job's blob store.

Every rank seals its own optimizer shard; the lead rank seals the model, then
commits the manifest that makes the checkpoint exist (see
``cantata.security.sealed_checkpoint``). In decentralized training, where
one worker group commits for all, every rank also seals its data position
beside the checkpoint (:meth:`JobCheckpoints.save_position`). The worker
holds only its job's derived keys, handed over by the server in its 0600
config file.
"""

from __future__ import annotations

import json
from typing import TypedDict

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

    def save_position(self, step: int, worker: int, state: dict) -> None:
        """Seal ``worker``'s data position (a feed's plain ``state_dict()``) beside checkpoint ``step``."""
        write_shard(
            self._store,
            step=step,
            name=f"data-{worker}",
            state=json.dumps(state).encode(),
            kek=self._keys.current,
            **self._where,
        )

    def load_position(self, step: int, worker: int) -> dict | None:
        """The data position ``worker`` saved beside checkpoint ``step``, or None if it saved none."""
        raw = read_unlisted_shard(self._store, step=step, name=f"data-{worker}", keys=self._keys, **self._where)
        return None if raw is None else json.loads(raw)
