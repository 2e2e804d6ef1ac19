"""A job's checkpoints as its workers write and read them: sealed, in the job's blob store.

:class:`TrainingState` is the one registry of what a checkpoint holds: the
lead rank seals the model (and a decentralized worker's outer state), every
rank its own optimizer shard, then the lead commits the manifest that makes
the checkpoint exist (see ``cantata.security.sealed_checkpoint``). A mesh
job's model and optimizer are one ``SHARDED`` part: every rank writes its own
DTensor shards in parallel through ``torch.distributed.checkpoint``, each
object sealed (``cantata.trainer.sealed_dcp``), and any mesh loads them back.
Every process seals its data position beside the checkpoint, unlisted, since
in decentralized training one worker group commits for all. The worker holds
only its job's derived keys, handed over by the server in its 0600 config
file.

A save is :meth:`TrainingState.save` at once, or three phases for an
asynchronous one (``cantata.trainer.async_checkpoint``): :meth:`~TrainingState.stage`
copies the state to host memory on the training thread (DCP's collective
planning included), :meth:`~TrainingState.upload` seals and uploads the copies
on another thread, and :meth:`~TrainingState.publish`, back on the training
thread, commits the manifest once every rank's objects are durable, or fails
on every rank if any rank's upload failed.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils._pytree import tree_map_only

from cantata.security.keys import JobKeys
from cantata.security.sealed_checkpoint import (
    CheckpointInfo,
    MissingShardError,
    ShardInfo,
    begin_checkpoint,
    commit_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    read_manifest,
    read_shard_buffer,
    read_unlisted_shard,
    write_shard,
    write_shard_parts,
)
from cantata.storage import BlobStore, open_store
from cantata.storage.outage import OutageListener
from cantata.trainer.sealed_dcp import SafeLoadPlanner, SealedReader, SealedWriter, first_failure

T = TypeVar("T")


class CheckpointFormatError(ValueError):
    """A checkpoint holds neither format of a part this job restores (say which, and why)."""


class CheckpointUploadError(RuntimeError):
    """Another rank's upload of an asynchronous save failed: the checkpoint was not committed."""


@dataclass(frozen=True)
class StagedObject:
    """One DCP object of a rank (``PART.RANK`` or ``PART.metadata``), its parts copied to host memory."""

    name: str
    parts: list[bytes]


@dataclass(frozen=True)
class Staged:
    """A save's committed state copied off the training tensors, to be sealed and uploaded on another thread."""

    step: int
    objects: list[StagedObject]  # the SHARDED parts, as DCP lays them out
    shards: dict[str, Any]  # the LEAD and RANK shards this rank lists, their tensors copied to the CPU


def host_copy(state: Any) -> Any:
    """``state`` with every tensor copied to the CPU: later training steps do not change the copy."""
    return tree_map_only(torch.Tensor, lambda tensor: tensor.detach().to("cpu", copy=True), state)


class _Where(TypedDict):
    """Whose checkpoints: every sealed-checkpoint call takes these."""

    tenant: str
    job_id: str


class JobCheckpoints:
    def __init__(
        self,
        store: str | BlobStore,
        tenant: str,
        job_id: str,
        keys: JobKeys,
        keep_last: int,
        outages: OutageListener | None = None,
    ):
        """``keep_last``: the newest checkpoints kept; older ones are deleted once a newer manifest is written.

        ``store``: the job's checkpoint store, or its URI; ``outages`` hears when a store opened from a URI stops
        answering while its calls are retried, and when it answers again.
        """
        self._store = store if isinstance(store, BlobStore) else open_store(store, outages=outages)
        self._keep_last = keep_last
        self._where: _Where = {"tenant": tenant, "job_id": job_id}
        self._keys = keys
        self.last_sharded: tuple[float, int] = (0.0, 0)  # this rank's last sharded write: seconds, sealed bytes

    def latest_step(self) -> int | None:
        """The newest checkpoint whose manifest verifies, or None."""
        info = latest_checkpoint(self._store, keys=self._keys, **self._where)
        return info.step if info else None

    def manifest(self, step: int) -> CheckpointInfo:
        return read_manifest(self._store, step=step, keys=self._keys, **self._where)

    def load(self, step: int, skip: tuple[str, ...] = ()) -> dict:
        """Every shard of checkpoint ``step`` but those named ``SKIP.*``, verified before anything is deserialised."""
        prefixes = tuple(f"{name}." for name in skip)
        return load_checkpoint(
            self._store, step=step, keys=self._keys, only=lambda shard: not shard.startswith(prefixes), **self._where
        )

    def begin(self, step: int, rank: int, group) -> None:
        """No checkpoint exists at ``step`` from here until :meth:`commit` (the lead removes its manifest)."""
        if rank == 0:
            begin_checkpoint(self._store, step=step, **self._where)
        if group is not None:
            dist.barrier(group)

    def save_sharded(self, step: int, part: str, state: dict, group) -> list[ShardInfo]:
        """Every rank writes its own shards of ``state`` (DTensors) as the sealed objects ``PART.*`` (collective)."""

        def seal(name: str, parts: Iterable[bytes | memoryview]) -> ShardInfo:
            return write_shard_parts(
                self._store, step=step, name=name, parts=parts, kek=self._keys.current, **self._where
            )

        writer = SealedWriter(seal, part)
        began = time.perf_counter()
        with first_failure():
            dcp.save(state, storage_writer=writer, process_group=group)
        self.last_sharded = (time.perf_counter() - began, sum(info.sealed_size for info in writer.written))
        return writer.written

    def stage_sharded(self, step: int, part: str, state: dict, group) -> list[StagedObject]:
        """Copy this rank's shards of ``state`` as DCP lays them out in ``PART.*`` objects (collective; no upload)."""
        writer = SealedWriter(lambda name, parts: StagedObject(name, [bytes(part) for part in parts]), part)
        with first_failure():
            dcp.save(state, storage_writer=writer, process_group=group)
        return writer.written

    def upload(self, step: int, staged: Staged) -> list[ShardInfo]:
        """Seal and upload what :meth:`TrainingState.stage` copied (any thread); returns this rank's objects."""
        began = time.perf_counter()
        written = [
            write_shard_parts(
                self._store, step=step, name=item.name, parts=item.parts, kek=self._keys.current, **self._where
            )
            for item in staged.objects
        ]
        self.last_sharded = (time.perf_counter() - began, sum(info.sealed_size for info in written))
        return written + [
            write_shard(self._store, step=step, name=name, state=state, kek=self._keys.current, **self._where)
            for name, state in staged.shards.items()
        ]

    def load_sharded(self, step: int, info: CheckpointInfo, part: str, state: dict, group) -> None:
        """Fill ``state`` in place from the ``PART.*`` objects of checkpoint ``step`` (any mesh; collective)."""
        listed = {shard.name: shard for shard in info.shards}

        def read(name: str) -> memoryview:
            if name not in listed:
                raise MissingShardError(f"{name!r} is not listed in the manifest of step {step}")
            return read_shard_buffer(self._store, step=step, shard=listed[name], keys=self._keys, **self._where)

        with first_failure():
            dcp.load(state, storage_reader=SealedReader(read, part), planner=SafeLoadPlanner(), process_group=group)

    def commit(self, step: int, rank: int, shards: dict[str, dict], group, written: list[ShardInfo]) -> int | None:
        """Seal this rank's ``shards``; the lead commits them and every rank's ``written``. Returns the size on the lead."""
        infos = written + [
            write_shard(self._store, step=step, name=name, state=state, kek=self._keys.current, **self._where)
            for name, state in shards.items()
        ]
        return self.publish(step, rank, group, infos)

    def publish(self, step: int, rank: int, group, uploaded: list[ShardInfo] | BaseException) -> int | None:
        """The lead commits every rank's ``uploaded`` objects (collective); returns the size on the lead.

        Where any rank's upload failed (``uploaded`` is its error) nothing is committed: that rank raises its
        error, every other one :class:`CheckpointUploadError`.
        """
        mine = uploaded if isinstance(uploaded, list) else f"{type(uploaded).__name__}: {uploaded}"
        everyone: list[list[ShardInfo] | str] = [mine]
        if group is not None:
            everyone = [[] for _ in range(dist.get_world_size(group))]
            dist.all_gather_object(everyone, mine, group=group)
        if isinstance(uploaded, BaseException):
            raise uploaded
        failed = [f"rank {r}: {error}" for r, error in enumerate(everyone) if isinstance(error, str)]
        if failed:
            raise CheckpointUploadError(f"checkpoint at step {step} not committed: {'; '.join(failed)}")
        if rank != 0:
            return None
        infos = [info for rank_infos in everyone if isinstance(rank_infos, list) for info in rank_infos]
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
    SHARDED = "sharded"  # every rank of the committing group, through DCP: ``name.RANK`` and ``name.metadata``


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


class ShardedStateful(Stateful, Protocol):
    """A ``SHARDED`` part: its state dict holds DTensors, loaded in place; it may read an older unsharded form."""

    def load_unsharded(self, listed: dict[str, Any], /) -> None:
        """Restore from the listed shards of a checkpoint written before sharded checkpoints."""


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
        sharded = tuple(part.name for part in self._parts if part.scope is Scope.SHARDED)
        info = self._checkpoints.manifest(step)
        self._listed = self._checkpoints.load(step, skip=sharded)
        for part in self._parts:
            if part.scope in (Scope.LEAD, Scope.RANK):
                part.holder.load_state_dict(self._listed[self.shard_name(part)])
            elif part.scope is Scope.SHARDED:
                holder: ShardedStateful = part.holder  # type: ignore[assignment]
                if not any(shard.name == f"{part.name}.metadata" for shard in info.shards):
                    holder.load_unsharded(self._listed)  # a checkpoint from before sharded checkpoints
                    continue
                state = holder.state_dict()
                self._checkpoints.load_sharded(step, info, part.name, state, self._group)
                holder.load_state_dict(state)

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

    def _begin(self, step: int) -> bool:
        """Seal the ``PROCESS`` parts at ``step`` and open the checkpoint; whether this process commits it."""
        for part in self._parts:
            if part.scope is Scope.PROCESS:
                self._checkpoints.save_beside(step, self.shard_name(part), part.holder.state_dict())
        if not self._commits:
            return False
        self._checkpoints.begin(step, self._rank, self._group)
        return True

    def _listed_states(self, copy: Callable[[dict], dict]) -> dict[str, dict]:
        """The ``LEAD`` (on rank 0) and ``RANK`` parts' states by shard name, each through ``copy``.

        Every rank takes every listed state: a sharded model's ``state_dict`` is collective.
        """
        listed = [part for part in self._parts if part.scope in (Scope.LEAD, Scope.RANK)]
        states = [part.holder.state_dict() for part in listed]
        return {
            self.shard_name(part): copy(state)
            for part, state in zip(listed, states, strict=True)
            if part.scope is Scope.RANK or self._rank == 0
        }

    def save(self, step: int) -> int | None:
        """Seal this process's parts at ``step``; returns the committed size on the lead, else None."""
        if not self._begin(step):
            return None
        written = [
            info
            for part in self._parts
            if part.scope is Scope.SHARDED
            for info in self._checkpoints.save_sharded(step, part.name, part.holder.state_dict(), self._group)
        ]
        return self._checkpoints.commit(
            step, self._rank, self._listed_states(lambda state: state), self._group, written
        )

    def stage(self, step: int) -> Staged | None:
        """An asynchronous save's first phase: seal the ``PROCESS`` parts, copy the committed ones (collective).

        None where this process does not commit. No checkpoint exists at ``step`` from here until :meth:`publish`.
        """
        if not self._begin(step):
            return None
        objects = [
            staged
            for part in self._parts
            if part.scope is Scope.SHARDED
            for staged in self._checkpoints.stage_sharded(step, part.name, part.holder.state_dict(), self._group)
        ]
        return Staged(step, objects, self._listed_states(host_copy))

    def upload(self, staged: Staged) -> list[ShardInfo]:
        """The second phase, on any thread: seal and upload this rank's staged objects."""
        return self._checkpoints.upload(staged.step, staged)

    def publish(self, staged: Staged, uploaded: list[ShardInfo] | BaseException) -> int | None:
        """The last phase (collective): commit the manifest once every rank uploaded, or fail on every rank."""
        return self._checkpoints.publish(staged.step, self._rank, self._group, uploaded)


def share_from_rank0(value: T, group: dist.ProcessGroup | None) -> T:
    """Rank 0's ``value`` on every rank of ``group``."""
    if group is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
