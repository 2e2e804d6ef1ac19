"""Jobs: submit, get, list, cancel, resume, watch events, read logs. Scoped to the caller's tenant."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from cantata.proto.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from cantata.proto.vocabulary import REQUEST_ID_RULE, valid_request_id
from cantata.security.audit import Action, AuditLogUnavailable, Outcome
from cantata.server.auth import caller
from cantata.server.datasource_store import DataSourceNotFound
from cantata.server.deletion import JobDeletion
from cantata.server.jobspec import InvalidField, dataset_source, parse_job_spec, processes
from cantata.server.lifecycle import JobLifecycle
from cantata.server.ports import AuditSink, DataSourceDirectory
from cantata.server.store import JobRecord, QuotaExceeded, RequestIdReused, Store

# Submissions refused for what they ask (not for an outage): each is recorded in the audit log.
REFUSALS = (InvalidField, QuotaExceeded, DataSourceNotFound, RequestIdReused)
WATCH_POLL = 1.0  # seconds between checks that a watcher is still connected


def submitted_digest(spec: common_pb2.JobSpec) -> str:
    """SHA-256 of a job spec as the tenant sent it (before the server's defaults): what a retry must repeat."""
    return hashlib.sha256(spec.SerializeToString(deterministic=True)).hexdigest()


def job_info(job: JobRecord) -> common_pb2.JobInfo:
    info = common_pb2.JobInfo(
        id=job.id,
        tenant=job.tenant,
        spec=job.spec,
        state=job.state,
        reason=job.reason,
        step=job.step,
        loss=job.loss,
        val_loss=job.val_loss,
        request_id=job.request_id,
    )
    info.created.FromJsonString(job.created_at.replace("+00:00", "Z"))
    info.updated.FromJsonString(job.updated_at.replace("+00:00", "Z"))
    return info


def _since(request: jobs_pb2.ListJobsRequest) -> str:
    """The ``since`` filter as the store's time text; empty when not given."""
    if not request.HasField("since"):
        return ""
    return request.since.ToDatetime(tzinfo=dt.UTC).isoformat(timespec="milliseconds")


class JobsService(jobs_pb2_grpc.JobsServicer):
    def __init__(
        self,
        store: Store,
        lifecycle: JobLifecycle,
        log_path: Callable[[str, int], Path],
        spec_defaults: dict,
        audit: AuditSink,
        data_sources: DataSourceDirectory,
        deletion: JobDeletion,
    ):
        self._store = store
        self._lifecycle = lifecycle
        self._log_path = log_path
        self._spec_defaults = spec_defaults
        self._audit = audit.append
        self._data_source_exists = data_sources.exists
        self._deletion = deletion

    def _job(self, context, job_id: str) -> JobRecord:
        """The caller's job; anyone else's is indistinguishable from a missing one."""
        return self._store.job(job_id, tenant=caller(context).name)

    def SubmitJob(self, request, context):
        try:
            return self._submit(request, context)
        except REFUSALS as exc:
            self._record_refusal(request, context, exc)
            raise

    def _record_refusal(self, request, context, exc: Exception) -> None:
        """A refused submission is on the record too (what was asked, and why not); the refusal stands either way."""
        details = {"name": request.spec.name[:128], "error": type(exc).__name__, "message": str(exc)[:500]}
        if isinstance(exc, InvalidField):
            details["field"] = exc.field
        with contextlib.suppress(AuditLogUnavailable):  # the log's failure is in the server log
            self._audit(
                caller(context).uri,
                Action.JOB_SUBMITTED,
                tenant=caller(context).name,
                outcome=Outcome.REFUSED,
                details=details,
                peer=context.peer(),
            )

    def _submit(self, request, context):
        tenant_name = caller(context).name
        if not valid_request_id(request.request_id):
            raise InvalidField("request_id", REQUEST_ID_RULE)
        digest = submitted_digest(request.spec)
        spec = parse_job_spec(request.spec, **self._spec_defaults)
        source = dataset_source(spec.dataset)
        if source and not self._data_source_exists(tenant_name, source):
            raise DataSourceNotFound(f"dataset: data source {source!r} not found")
        with self._store.database.transaction():  # the job exists only once its record is durable
            job, created = self._store.submit_job(self._store.tenant(tenant_name), request.request_id, spec, digest)
            if created:
                self._audit(
                    caller(context).uri,
                    Action.JOB_SUBMITTED,
                    resource=job.id,
                    tenant=tenant_name,
                    details={
                        "name": spec.name,
                        "algorithm": spec.algorithm,
                        "workers": spec.workers,
                        "steps": spec.steps,
                    },
                    peer=context.peer(),
                )
        return job_info(job)

    def GetJob(self, request, context):
        return job_info(self._job(context, request.job_id))

    def ListJobs(self, request, context):
        size = min(request.page_size or 100, 1000)
        if request.page_token:
            self._job(context, request.page_token)
        jobs = self._store.jobs(
            tenant=caller(context).name,
            states=frozenset(request.states) or None,
            tag=request.tag,
            since=_since(request),
            after=request.page_token,
            limit=size + 1,
        )
        token = jobs[size - 1].id if len(jobs) > size else ""
        return jobs_pb2.ListJobsReply(jobs=[job_info(j) for j in jobs[:size]], next_page_token=token)

    def CancelJob(self, request, context):
        job = self._job(context, request.job_id)
        self._lifecycle.cancel_requested(job, actor=caller(context).uri, peer=context.peer())
        return job_info(self._store.job(job.id))

    def ResumeJob(self, request, context):
        job = self._job(context, request.job_id)
        self._lifecycle.resume_requested(job, actor=caller(context).uri, peer=context.peer())
        return job_info(self._store.job(job.id))

    def DeleteJob(self, request, context):
        job = self._job(context, request.job_id)
        objects = self._deletion.delete(job, actor=caller(context).uri, peer=context.peer(), reason="requested")
        return jobs_pb2.DeleteJobReply(job_id=job.id, checkpoint_objects_deleted=objects)

    def WatchJob(self, request, context):
        """Events after the cursor, to the job's end; an earlier end that a resume followed is not the end."""
        job = self._job(context, request.job_id)
        context.send_initial_metadata(())  # the stream is open: a client resuming it knows before any event
        cursor = max(0, request.cursor)
        while context.is_active():
            for event in self._store.events_after(job.id, cursor, wait=WATCH_POLL):
                if event.terminal and self._store.resumed_after(job.id, event.seq):
                    event.terminal = False
                yield event
                cursor = event.seq
                if event.terminal:
                    return

    def ReadLogs(self, request, context):
        """Worker logs in worker order; with ``follow``, new lines as they are written."""
        job = self._job(context, request.job_id)
        read = [0] * processes(job.spec)  # lines already sent, per worker process
        sent, skip = 0, max(0, request.offset)
        while context.is_active():
            for worker in range(processes(job.spec)):
                path: Path = self._log_path(job.id, worker)
                lines = path.read_text(errors="replace").splitlines() if path.exists() else []
                for line in lines[read[worker] :]:
                    sent += 1
                    if sent > skip:
                        yield jobs_pb2.LogLine(offset=sent, worker=worker, line=line)
                read[worker] = len(lines)
            if not request.follow or self._store.job(job.id).terminal:
                return
            time.sleep(0.5)
