"""Checkpoints: list a job's checkpoints and stream one, decrypted, to the tenant who owns it.

The store is the source of truth: a checkpoint exists only if its sealed
manifest verifies under the job's key. A mesh job's checkpoint is sharded
(every rank's object plus DCP's metadata): the server, which never imports
torch, streams those objects each verified against the manifest, and the
client consolidates them (``consolidate`` in the request).
"""

from __future__ import annotations

import hashlib

from cantata.proto.v1 import checkpoints_pb2, checkpoints_pb2_grpc
from cantata.security.audit import Action
from cantata.security.keys import KeyProvider
from cantata.security.sealed_checkpoint import SHARDED_PART, IntegrityError, ShardInfo, list_checkpoints, read_shard
from cantata.server.auth import caller
from cantata.server.errors import DataLoss, InvalidRequest, Unavailable
from cantata.server.store import JobRecord, NotFound, Store
from cantata.storage import StoreError, StoreNotFound, StorePermissionError, open_store

MODEL_SHARD = "model"


class CheckpointsService(checkpoints_pb2_grpc.CheckpointsServicer):
    def __init__(self, store: Store, keyring: KeyProvider, audit):
        self._store = store
        self._keyring = keyring
        self._audit = audit

    def _scoped(self, context, job_id: str) -> JobRecord:
        return self._store.job(job_id, tenant=caller(context).name)

    def _list(self, job: JobRecord):
        try:
            return list_checkpoints(
                open_store(job.spec.checkpoint_store),
                tenant=job.tenant,
                job_id=job.id,
                keys=self._keyring.job_keys(job.tenant, job.id),
            )
        except (StoreNotFound, StorePermissionError):
            raise  # permanent: mapped as such, never as UNAVAILABLE
        except StoreError as exc:
            raise Unavailable(f"checkpoint store unavailable: {exc}") from exc

    def ListCheckpoints(self, request, context):
        job = self._scoped(context, request.job_id)
        reply = checkpoints_pb2.ListCheckpointsReply()
        for info in self._list(job):
            ckpt = reply.checkpoints.add(job_id=job.id, step=info.step, size_bytes=info.plaintext_size)
            ckpt.created.FromJsonString(info.created_at.replace("+00:00", "Z"))
        return reply

    def DownloadCheckpoint(self, request, context):
        if request.step < 0:
            raise InvalidRequest(f"step must be >= 0, not {request.step}", field="step")
        job = self._scoped(context, request.job_id)
        info = next((c for c in self._list(job) if c.step == request.step), None)
        shards = _served(info.shards) if info else []
        if info is None or not shards:
            raise NotFound(f"checkpoint {request.step} of job {job.id!r} not found")
        sharded = shards[0].name != MODEL_SHARD
        if sharded and not request.consolidate:
            raise InvalidRequest(
                f"checkpoint {info.step} of job {job.id!r} is sharded (a mesh job's): download it consolidated",
                field="consolidate",
            )
        me = caller(context)
        resource = f"{job.id}@{info.step}"
        self._audit(
            me.uri,
            Action.KEY_UNWRAPPED,
            resource=resource,
            tenant=job.tenant,
            details={"purpose": "checkpoint download"},
            peer=context.peer(),
        )
        self._audit(me.uri, Action.CHECKPOINT_DOWNLOADED, resource=resource, tenant=job.tenant, peer=context.peer())
        digest = hashlib.sha256()
        keys = self._keyring.job_keys(job.tenant, job.id)
        store = open_store(job.spec.checkpoint_store)
        try:
            for shard in shards:
                if sharded:
                    yield checkpoints_pb2.DataChunk(object=shard.name)
                for segment in read_shard(
                    store, tenant=job.tenant, job_id=job.id, step=info.step, shard=shard, keys=keys
                ):
                    digest.update(segment)
                    yield checkpoints_pb2.DataChunk(data=segment)
        except IntegrityError as exc:
            self._audit(
                me.uri,
                Action.CHECKPOINT_READ,
                resource=resource,
                tenant=job.tenant,
                outcome="failed",
                details={"error": type(exc).__name__},
            )
            raise DataLoss(f"checkpoint {resource} failed verification: {exc}") from exc
        yield checkpoints_pb2.DataChunk(sha256=digest.hexdigest())


def _served(shards: tuple[ShardInfo, ...]) -> list[ShardInfo]:
    """What a download streams: the full model state, else every object of the sharded state (verified one by one)."""
    full = [shard for shard in shards if shard.name == MODEL_SHARD]
    return full or [shard for shard in shards if shard.name.startswith(f"{SHARDED_PART}.")]
