"""Worker: how a job's worker processes report progress, checkpoints and their end."""

from __future__ import annotations

import grpc

from cantata.proto.v1 import common_pb2, jobs_pb2, worker_pb2, worker_pb2_grpc
from cantata.security.audit import Action
from cantata.server.auth import abort, caller
from cantata.server.store import Store


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(self, store: Store, audit):
        self._store = store
        self._audit = audit

    def Report(self, request, context):
        me = caller(context)
        if request.job_id != me.name or request.worker != me.index:
            self._audit(me.uri, Action.AUTHZ_DENIED, resource=request.job_id, outcome="denied",
                        details={"reason": "worker reported for another job or index"}, peer=context.peer())
            abort(context, grpc.StatusCode.PERMISSION_DENIED, "a worker may only report for itself")
        job = self._store.job(me.name)
        kind = request.WhichOneof("payload")
        event = None
        if kind == "started":
            if job.state == common_pb2.STARTING and request.worker == 0:
                self._store.transition(job.id, common_pb2.RUNNING, "workers running")
        elif kind == "progress":
            p = request.progress
            self._store.record_progress(job.id, step=p.step, loss=p.loss)
            event = jobs_pb2.JobEvent(kind=jobs_pb2.PROGRESS, step=p.step, loss=p.loss, tokens_per_s=p.tokens_per_s)
        elif kind == "eval":
            e = request.eval
            self._store.record_progress(job.id, step=e.step, val_loss=e.val_loss)
            event = jobs_pb2.JobEvent(kind=jobs_pb2.EVAL, step=e.step, val_loss=e.val_loss)
        elif kind == "checkpoint":
            c = request.checkpoint
            self._store.add_checkpoint(job.id, c.step, c.uri, c.size_bytes)
            self._audit(me.uri, Action.CHECKPOINT_WRITTEN, resource=f"{job.id}@{c.step}", tenant=job.tenant,
                        details={"bytes": c.size_bytes})
            event = jobs_pb2.JobEvent(kind=jobs_pb2.CHECKPOINT, step=c.step, message=f"checkpoint at step {c.step}")
        elif kind == "finished":
            self._store.mark_worker(job.id, request.worker, finished=True)
            if request.worker == 0:
                self._store.record_progress(job.id, step=job.spec.steps, val_loss=request.finished.final_val_loss)
        elif kind == "failed":
            self._store.mark_worker(job.id, request.worker, failure=request.failed.reason[:2000])
        elif kind == "message":
            event = jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, message=request.message.text[:2000])
        else:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "empty report")
        if event is not None:
            event.worker = request.worker
            event.total_steps = job.spec.steps
            self._store.append_event(job.id, event)
        return worker_pb2.WorkerReportReply(stop=self._store.job(job.id).state == common_pb2.CANCELLING)
