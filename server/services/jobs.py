"""Jobs: submit, get, list, cancel, resume, watch events, read logs. Scoped to the caller's tenant."""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import datetime as dt
import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from cantata.proto.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from cantata.proto.vocabulary import REQUEST_ID_RULE, valid_request_id
from cantata.security.audit import Action, AuditLogUnavailable, Outcome
from cantata.server.auth import caller, request_id
from cantata.server.broadcast import EventBroadcast
from cantata.server.cache import Cache
from cantata.server.datasource_store import DataSourceNotFound
from cantata.server.errors import InvalidRequest
from cantata.server.jobs.deletion import JobDeletion
from cantata.server.jobs.jobspec import InvalidField, job_sources, parse_job_spec, processes
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.jobs.submissions import SubmitWriter
from cantata.server.network.ports import DataSourceDirectory
from cantata.server.request_audit import RequestAudit
from cantata.server.store import JobRecord, NotFound, QuotaExceeded, RequestIdReused, Store
from cantata.server.store.metrics import MetricsStore, UnknownMetric

LOG_POLL = 0.5  # seconds between looks at a followed job's log files
# Submissions refused for what they ask (not for an outage): each is recorded in the audit log.
REFUSALS = (InvalidField, QuotaExceeded, DataSourceNotFound, RequestIdReused)


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
    info.created.FromNanoseconds(_nanoseconds(job.created_at))
    info.updated.FromNanoseconds(_nanoseconds(job.updated_at))
    return info


@functools.lru_cache(maxsize=4096)  # a job's times are read on every look at it
def _nanoseconds(stored: str) -> int:
    """A store time (:func:`~cantata.server.store.utcnow`, with its offset) as nanoseconds since the epoch."""
    moment = dt.datetime.fromisoformat(stored)
    return (calendar.timegm(moment.utctimetuple()) * 1_000_000 + moment.microsecond) * 1000


def _complete_lines(path: Path) -> list[str]:
    """The lines of a worker log that a newline ends (a line still being written waits for the next pass)."""
    text = path.read_text(errors="replace")
    return text[: text.rfind("\n") + 1].splitlines()


def _since(request: jobs_pb2.ListJobsRequest | jobs_pb2.GetMetricsRequest) -> str:
    """The ``since`` filter as the store's time text; empty when not given."""
    if not request.HasField("since"):
        return ""
    try:
        return request.since.ToDatetime(tzinfo=dt.UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError) as e:  # seconds or nanos outside what a timestamp may hold
        raise InvalidRequest(f"since is not a valid time: {e}", field="since") from e


class JobsService(jobs_pb2_grpc.JobsServicer):
    def __init__(
        self,
        store: Store,
        lifecycle: JobLifecycle,
        log_path: Callable[[str, int], Path],
        spec_defaults: Callable[[str], dict],
        audit: RequestAudit,
        data_sources: DataSourceDirectory,
        broadcast: EventBroadcast,
        deletion: JobDeletion,
        metrics: MetricsStore,
        submissions: SubmitWriter,
    ):
        self._store = store
        self._submissions = submissions
        self._replies = Cache[str, tuple[str, bytes]](limit=10_000)  # GetJob's, until a commit changes a job
        store.database.on_commit_changing("jobs", self._replies.clear)
        lifecycle.on_shown_change(self._replies.clear)
        self._metrics = metrics
        self._lifecycle = lifecycle
        self._log_path = log_path
        self._spec_defaults = spec_defaults  # tenant -> parse_job_spec's keyword arguments
        self._audit = audit.append
        self._data_source_exists = data_sources.exists
        self._broadcast = broadcast
        self._deletion = deletion

    def _job(self, context, job_id: str) -> JobRecord:
        """The caller's job; anyone else's is indistinguishable from a missing one."""
        return self._store.job(job_id, tenant=caller(context).name)

    async def SubmitJob(self, request, context):
        """On the event loop: checked here, written by the submit writer's thread with others in one batch
        (:mod:`cantata.server.jobs.submissions`), answered once the job and its audit record are both durable."""
        who = caller(context)
        try:
            if not valid_request_id(request.request_id):
                raise InvalidField("request_id", REQUEST_ID_RULE)
            digest = submitted_digest(request.spec)
            spec = parse_job_spec(request.spec, **self._spec_defaults(who.name))
            for field, source in job_sources(spec).items():  # another tenant's source is not found either
                if not self._data_source_exists(who.name, source):
                    raise DataSourceNotFound(f"{field}: data source {source!r} not found")
            if request.dry_run:
                await asyncio.to_thread(self._store.check_quota, who.name, spec)
                return common_pb2.JobInfo(tenant=who.name, spec=spec, request_id=request.request_id)
            job, created = await self._submissions.submit(
                who.name, request.request_id, spec, digest, actor=who.uri, peer=context.peer(), call_id=request_id()
            )
        except REFUSALS as exc:
            await asyncio.to_thread(self._record_refusal, request, context, exc)
            raise
        if not created:  # a retry: answered as the first submission, which is durable and recorded, or undone
            try:
                job = await asyncio.to_thread(self._store.job, job.id)
            except NotFound:
                raise AuditLogUnavailable(
                    f"the first submission with request id {request.request_id} could not be recorded; submit again"
                ) from None
        return job_info(job)

    def _record_refusal(self, request, context, exc: Exception) -> None:
        """A refused submission is on the record too (what was asked, and why not); the refusal stands either way."""
        details = {"name": request.spec.name[:128], "error": type(exc).__name__, "message": str(exc)[:500]}
        if request.dry_run:
            details["dry_run"] = True
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

    async def GetJob(self, request, context):
        """On the event loop, without a thread: the reply from memory while the job is unchanged (no commit
        changed a job since it was read), else one read by primary key, from this thread's reader."""
        tenant, reply = self._replies.get(request.job_id, self._reply)
        if tenant != caller(context).name:
            raise NotFound(f"job {request.job_id!r} not found")
        return reply

    def _reply(self, job_id: str) -> tuple[str, bytes]:
        """The job's tenant, and its ``GetJob`` reply as sent."""
        job = self._store.job(job_id)
        return job.tenant, job_info(self._lifecycle.shown(job)).SerializeToString()

    def GetMetrics(self, request, context):
        """A page of the job's metrics history: ``page_size`` 0 takes 5,000, more than 20,000 takes 20,000."""
        job = self._job(context, request.job_id)
        _at_least_zero(request.page_size, "page_size")
        _at_least_zero(request.after, "after")
        size = min(request.page_size or 5000, 20_000)
        since = _since(request)
        try:
            points = self._metrics.rows(
                job.id,
                request.names,
                dt.datetime.fromisoformat(since).timestamp() if since else None,
                after=request.after,
                limit=size + 1,
            )
        except UnknownMetric as exc:
            raise InvalidRequest(str(exc), field="names") from None
        reply = jobs_pb2.GetMetricsReply(next_after=points[size - 1].seq if len(points) > size else 0)
        for p in points[:size]:
            point = reply.points.add(seq=p.seq, step=p.step, worker=p.worker, name=p.name, value=p.value)
            point.time.FromNanoseconds(round(p.time * 1e9))
            if p.peer is not None:
                point.peer = p.peer
        return reply

    def ListJobs(self, request, context):
        """A page of the caller's jobs: ``page_size`` 0 takes 100, more than 1,000 takes 1,000, below 0 is refused."""
        _at_least_zero(request.page_size, "page_size")
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
        return jobs_pb2.ListJobsReply(
            jobs=[job_info(self._lifecycle.shown(j)) for j in jobs[:size]], next_page_token=token
        )

    def CancelJob(self, request, context):
        job = self._job(context, request.job_id)
        self._lifecycle.cancel_requested(job, actor=caller(context).uri, peer=context.peer())
        return job_info(self._lifecycle.shown(self._store.job(job.id)))

    def ResumeJob(self, request, context):
        job = self._job(context, request.job_id)
        changes = {field: getattr(request, field) for field in ("workers", "dp_replicate", "dp_shard", "tp", "steps")}
        self._lifecycle.resume_requested(job, actor=caller(context).uri, peer=context.peer(), changes=changes)
        return job_info(self._store.job(job.id))

    def DeleteJob(self, request, context):
        job = self._job(context, request.job_id)
        objects = self._deletion.delete(job, actor=caller(context).uri, peer=context.peer(), reason="requested")
        return jobs_pb2.DeleteJobReply(job_id=job.id, checkpoint_objects_deleted=objects)

    async def WatchJob(self, request, context):
        """Events after the cursor, to the job's end; an earlier end that a resume followed is not the end.

        What the store holds first, then what the broadcast pushes: the watcher waits on the event loop and
        holds no thread while nothing happens. It writes each event itself (a pushed one as the bytes every
        watcher shares): no generator between it and the call.
        """
        _at_least_zero(request.cursor, "cursor")
        job = await asyncio.to_thread(self._job, context, request.job_id)
        await context.send_initial_metadata(())  # the stream is open: a client resuming it knows before any event
        cursor = request.cursor
        with self._broadcast.subscribe(job.id) as live:  # before reading the store, so nothing falls between
            catching_up = True
            while True:
                from_store = catching_up
                if catching_up:
                    stored = await asyncio.to_thread(self._store.events_after, job.id, cursor)
                    events: Sequence[tuple[jobs_pb2.JobEvent, bytes | None]] = [(e, None) for e in stored]
                    catching_up = bool(events)
                else:
                    events = await live.next_encoded()  # with the bytes every watcher shares
                    if live.overflowed:  # it fell too far behind: read the store again from the cursor
                        live.overflowed, catching_up = False, True
                        continue
                for index, (event, encoded) in enumerate(events):
                    if event.seq <= cursor:
                        continue
                    if (
                        event.terminal
                        and (
                            await asyncio.to_thread(self._store.resumed_after, job.id, event.seq)
                            if from_store  # a pushed end was the latest when it was pushed, unless its batch says not
                            else any(later.kind == jobs_pb2.STATE for later, _ in events[index + 1 :])
                        )
                    ):
                        event, encoded = _not_terminal(event), None
                    await context.write(event if encoded is None else encoded)
                    cursor = event.seq
                    if event.terminal:
                        return

    async def ReadLogs(self, request, context):
        """Worker logs in worker order; with ``follow``, new lines as they are written, to the job's end.

        Whether the job has ended is read before the logs are: the last pass after its end sends its last lines.
        """
        _at_least_zero(request.offset, "offset")
        job = await asyncio.to_thread(self._job, context, request.job_id)
        read = [0] * processes(job.spec)  # lines already sent, per worker process
        sent, skip = 0, request.offset
        while True:
            ended = not request.follow or (await asyncio.to_thread(self._store.job, job.id)).terminal
            for worker, line in await asyncio.to_thread(self._new_lines, job.id, read):
                sent += 1
                if sent > skip:
                    yield jobs_pb2.LogLine(offset=sent, worker=worker, line=line)
            if ended:
                return
            await asyncio.sleep(LOG_POLL)

    def _new_lines(self, job_id: str, read: list[int]) -> list[tuple[int, str]]:
        """Lines the workers wrote since ``read`` (lines already sent, per worker; advanced here)."""
        new: list[tuple[int, str]] = []
        for worker in range(len(read)):
            path: Path = self._log_path(job_id, worker)
            lines = _complete_lines(path) if path.exists() else []
            new.extend((worker, line) for line in lines[read[worker] :] if not grpc_internal(line))
            read[worker] = len(lines)
        return new


# A line gRPC's C core writes to a worker's stderr through absl logging (``E0000 00:00:1733.. 123 file.cc:42] ..``),
# and absl's notice before its logging is set up: the platform's plumbing, for the operator, not the tenant.
GRPC_LOG_LINE = re.compile(
    r"[DIWEF][0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]+\.[0-9]+ +[0-9]+ [A-Za-z0-9_./-]+:[0-9]+\] .*", re.DOTALL
)
ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def grpc_internal(line: str) -> bool:
    """Whether a worker's log line is gRPC's own (kept in the worker's log file, left out of ``ReadLogs``)."""
    return line.startswith(ABSL_NOTICE) or GRPC_LOG_LINE.fullmatch(line) is not None


def _not_terminal(event: jobs_pb2.JobEvent) -> jobs_pb2.JobEvent:
    """A copy of ``event`` that is not the end (a resume followed it); the broadcast's event is shared."""
    copy = jobs_pb2.JobEvent()
    copy.CopyFrom(event)
    copy.terminal = False
    return copy


def _at_least_zero(value: int, field: str) -> None:
    if value < 0:
        raise InvalidRequest(f"{field} must be >= 0, not {value}", field=field)
