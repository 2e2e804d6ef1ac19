"""Checkpoints: list a job's checkpoints and stream one to the tenant who owns it."""

from __future__ import annotations

import hashlib

import grpc

from cantata.proto.v1 import checkpoints_pb2, checkpoints_pb2_grpc
from cantata.security.audit import Action
from cantata.server.auth import abort, caller
from cantata.server.store import NotFound, Store

CHUNK = 1 << 20


class CheckpointsService(checkpoints_pb2_grpc.CheckpointsServicer):
    def __init__(self, store: Store, open_checkpoint, audit):
        self._store = store
        self._open = open_checkpoint  # (CheckpointRecord) -> binary file object of the model state
        self._audit = audit

    def _scoped(self, context, job_id: str):
        try:
            return self._store.job(job_id, tenant=caller(context).name)
        except NotFound:
            abort(context, grpc.StatusCode.NOT_FOUND, f"job {job_id!r} not found")

    def ListCheckpoints(self, request, context):
        job = self._scoped(context, request.job_id)
        reply = checkpoints_pb2.ListCheckpointsReply()
        for ckpt in self._store.checkpoints(job.id):
            info = reply.checkpoints.add(job_id=job.id, step=ckpt.step, size_bytes=ckpt.size_bytes)
            info.created.FromJsonString(ckpt.created_at.replace("+00:00", "Z"))
        return reply

    def DownloadCheckpoint(self, request, context):
        job = self._scoped(context, request.job_id)
        try:
            record = self._store.checkpoint(job.id, request.step)
        except NotFound:
            abort(context, grpc.StatusCode.NOT_FOUND, f"checkpoint {request.step} of job {job.id!r} not found")
        self._audit(caller(context).uri, Action.CHECKPOINT_DOWNLOADED, resource=f"{job.id}@{record.step}",
                    tenant=job.tenant, peer=context.peer())
        digest = hashlib.sha256()
        with self._open(record) as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                yield checkpoints_pb2.DataChunk(data=chunk)
        yield checkpoints_pb2.DataChunk(sha256=digest.hexdigest())
