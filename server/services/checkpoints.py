"""Checkpoints: list a job's checkpoints and stream one, decrypted, to the tenant who owns it.

The store is the source of truth: a checkpoint exists only if its sealed
manifest verifies under the job's key.
"""

from __future__ import annotations

import hashlib

from cantata.proto.v1 import checkpoints_pb2, checkpoints_pb2_grpc
from cantata.security.audit import Action
from cantata.security.keys import KeyProvider
from cantata.security.sealed_checkpoint import IntegrityError, list_checkpoints, read_shard
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
        shard = next((s for s in info.shards if s.name == MODEL_SHARD), None) if info else None
        if info is None or shard is None:
            raise NotFound(f"checkpoint {request.step} of job {job.id!r} not found")
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
        try:
            for segment in read_shard(
                open_store(job.spec.checkpoint_store),
                tenant=job.tenant,
                job_id=job.id,
                step=info.step,
                shard=shard,
                keys=keys,
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
