"""``client.jobs``: submit, find, follow and end jobs; ``JobHandle`` is one of them."""

from __future__ import annotations

import builtins
import datetime as dt
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.proto.vocabulary import STATE_NAMES, is_terminal
from cantata.sdk.errors import InvalidArgument, InvalidJob, StreamInterrupted, Unavailable, WaitTimedOut
from cantata.sdk.resource import Resource, utc

if TYPE_CHECKING:  # the job-field table loads only for a submit
    from cantata.sdk.client import Client
    from cantata.sdk.job import Job

RESUME_BACKOFF = (0.2, 5.0)  # first and longest pause between attempts to resume a stream
MAX_REQUEST_BYTES = 4 << 20


def _state_name(state: int) -> str | None:
    """A job state's name; None for the unset state (an event that is not a state change)."""
    return common_pb2.JobState.Name(state) if state != common_pb2.JOB_STATE_UNSPECIFIED else None


@dataclass(frozen=True)
class JobStatus:
    """A job as the server sees it; ``loss`` and ``val_loss`` are None until the job has reported one."""

    id: str
    name: str
    tenant: str
    state: str
    reason: str
    step: int
    steps: int
    loss: float | None
    val_loss: float | None
    algorithm: str
    workers: int
    created: str
    tags: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        return is_terminal(self.state)

    @classmethod
    def from_proto(cls, info: common_pb2.JobInfo) -> JobStatus:
        return cls(
            info.id,
            info.spec.name,
            info.tenant,
            common_pb2.JobState.Name(info.state),
            info.reason,
            info.step,
            info.spec.steps,
            info.loss or None,  # proto3 has no "unset" double: 0.0 is no report yet (a loss is never exactly 0)
            info.val_loss or None,
            info.spec.algorithm,
            info.spec.workers,
            info.created.ToJsonString(),
            tuple(info.spec.tags),
        )


# The event kinds that carry each value; other events hold None there.
_LOSS_KINDS = frozenset({jobs_pb2.PROGRESS, jobs_pb2.ROLLBACK})  # ROLLBACK: the loss that tripped the policy
_VAL_LOSS_KINDS = frozenset({jobs_pb2.EVAL})


@dataclass(frozen=True)
class Event:
    """One event of a job. Values an event of its ``kind`` does not carry are None (``state``: a STATE event's)."""

    seq: int
    time: str
    kind: str
    state: str | None
    terminal: bool
    step: int
    total_steps: int | None
    loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    message: str
    worker: int

    @classmethod
    def from_proto(cls, e: jobs_pb2.JobEvent) -> Event:
        return cls(
            e.seq,
            e.time.ToJsonString(),
            jobs_pb2.EventKind.Name(e.kind),
            _state_name(e.state),
            e.terminal,
            e.step,
            e.total_steps or None,
            e.loss if e.kind in _LOSS_KINDS else None,
            e.val_loss if e.kind in _VAL_LOSS_KINDS else None,
            e.tokens_per_s if e.kind == jobs_pb2.PROGRESS else None,
            e.message,
            e.worker,
        )


@dataclass(frozen=True)
class MetricRow:
    """One point of a job's metrics history (``Jobs.metrics``); ``peer`` only for per-peer metrics."""

    seq: int
    time: dt.datetime  # UTC, when the server recorded it
    step: int
    worker: int
    name: str
    value: float
    peer: int | None

    @classmethod
    def from_proto(cls, p: jobs_pb2.MetricPoint) -> MetricRow:
        return cls(
            p.seq,
            p.time.ToDatetime(tzinfo=dt.UTC),
            p.step,
            p.worker,
            p.name,
            p.value,
            p.peer if p.HasField("peer") else None,
        )


def _submit_request(job: Job, *, dry_run: bool = False) -> jobs_pb2.SubmitJobRequest:
    """``job``'s submission, checked here first (its fields, its size)."""
    job.validate()
    request = jobs_pb2.SubmitJobRequest(request_id=job.request_id, spec=job.to_proto(), dry_run=dry_run)
    if request.ByteSize() > MAX_REQUEST_BYTES:
        raise InvalidJob(f"request of {request.ByteSize()} bytes exceeds {MAX_REQUEST_BYTES}", field="request")
    return request


class Jobs(Resource):
    """``client.jobs``: the tenant's jobs (an admin's: any tenant's)."""

    def submit(self, job: Job) -> JobHandle:
        """Submit ``job``. Retrying with the same ``job.request_id`` returns the same job."""
        request = _submit_request(job)
        for attempt in range(3):
            try:
                info = self._client._jobs.SubmitJob(request, timeout=self._client.timeout)
                return JobHandle(self._client, info.id)
            except grpc.RpcError as err:
                error = self._client._error(err)
                if not isinstance(error, Unavailable) or attempt == 2:
                    raise error from None
                time.sleep(0.5 * 2**attempt)  # idempotent: safe to retry
        raise AssertionError("unreachable")

    def check(self, job: Job) -> dict[str, Any]:
        """What ``submit(job)`` would run, without creating it: the server checks it as a submission (its fields,
        the server's defaults, your data sources and quotas) and answers with every job field as it would run."""
        from cantata.proto import jobfields

        info = self._call(self._client._jobs.SubmitJob, _submit_request(job, dry_run=True))
        fields = {f.name: getattr(info.spec, f.name) for f in jobfields.FIELDS}
        return {
            name: list(value) if not isinstance(value, (str, int, float, bool)) else value
            for name, value in fields.items()
        }

    def get(self, job_id: str) -> JobStatus:
        return JobStatus.from_proto(self._call(self._client._jobs.GetJob, jobs_pb2.GetJobRequest(job_id=job_id)))

    def handle(self, job_id: str) -> JobHandle:
        """The job ``job_id`` to follow (``wait``, ``events``), without a call."""
        return JobHandle(self._client, job_id)

    def list(
        self,
        *,
        state: str | Iterable[str] = (),
        tag: str = "",
        since: dt.datetime | str | None = None,
        page_size: int = 200,
    ) -> builtins.list[JobStatus]:
        """Your jobs in creation order; the server filters them by any of ``state`` (names such as
        ``"RUNNING"``), by ``tag`` and by creation time at or after ``since`` (a datetime, naive is UTC,
        or ISO 8601 text)."""
        request = jobs_pb2.ListJobsRequest(page_size=page_size, states=_states(state), tag=tag)
        if since is not None:
            request.since.FromDatetime(utc(since))
        jobs = []
        while True:
            reply = self._call(self._client._jobs.ListJobs, request)
            jobs += [JobStatus.from_proto(j) for j in reply.jobs]
            request.page_token = reply.next_page_token
            if not request.page_token:
                return jobs

    def cancel(self, job_id: str) -> JobStatus:
        return JobStatus.from_proto(self._call(self._client._jobs.CancelJob, jobs_pb2.CancelJobRequest(job_id=job_id)))

    def resume(
        self,
        job_id: str,
        *,
        workers: int = 0,
        dp_replicate: int = 0,
        dp_shard: int = 0,
        tp: int = 0,
        steps: int = 0,
    ) -> JobHandle:
        """Resume a FAILED or CANCELLED job from its latest checkpoint, under the same id.

        The job is QUEUED again (subject to the tenant's quotas, like a submit) and its
        event stream goes on: the earlier terminal event stays in its history, and
        ``handle.events()`` and ``handle.wait()`` follow the job to its new end. A job in
        any other state is refused with ``Conflict``, except a SUCCEEDED one given more
        ``steps``. A mesh job may resume on another mesh (``workers`` and ``dp_shard``,
        ``tp``, ``dp_replicate``; 0 keeps a value): its sharded checkpoint loads on any,
        and the new mesh is checked as at submit.
        """
        request = jobs_pb2.ResumeJobRequest(
            job_id=job_id, workers=workers, dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, steps=steps
        )
        info = self._call(self._client._jobs.ResumeJob, request)
        return JobHandle(self._client, info.id)

    def delete(self, job_id: str) -> int:
        """Delete an ended job: its records, logs and checkpoints (audited); returns the checkpoint objects removed.

        A job that has not ended is refused with ``Conflict``; afterwards the job is ``NotFound``.
        """
        reply = self._call(self._client._jobs.DeleteJob, jobs_pb2.DeleteJobRequest(job_id=job_id))
        return reply.checkpoint_objects_deleted

    def events(self, job_id: str, cursor: int = 0) -> Iterator[Event]:
        """Every event after ``cursor``, live, ending with the terminal one.

        A dropped stream is resumed from the last event seen (no gaps, no
        duplicates), with backoff, for up to ``resume_window`` seconds since
        it was last connected (a server restart); then ``StreamInterrupted``
        is raised: a dropped stream never looks like a finished job.
        """
        return self._watch(job_id, cursor, deadline=None)

    def _watch(self, job_id: str, cursor: int, deadline: float | None) -> Iterator[Event]:
        """``events()``; past ``deadline`` (a ``time.monotonic()`` value), no read blocks: ``WaitTimedOut``."""
        down_since: float | None = None
        pause = RESUME_BACKOFF[0]
        while True:
            try:
                request = jobs_pb2.WatchJobRequest(job_id=job_id, cursor=cursor)
                stream = self._client._jobs.WatchJob(request, timeout=_left(deadline, job_id))
                stream.initial_metadata()  # the server sends it on opening the stream
                if not stream.done():  # (re)established: a quiet stream does not use up the window
                    down_since = None
                for raw in stream:
                    event = Event.from_proto(raw)
                    cursor = event.seq
                    down_since, pause = None, RESUME_BACKOFF[0]
                    yield event
                    if event.terminal:
                        return
            except grpc.RpcError as err:
                error = self._client._error(err)
                if not isinstance(error, Unavailable):
                    raise error from None
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            window_left = down_since + self._client.resume_window - now
            if window_left <= 0:
                raise StreamInterrupted(
                    f"event stream of {job_id} dropped after event {cursor} and not resumed "
                    f"within {self._client.resume_window:g} s"
                )
            time.sleep(min(pause, window_left, _left(deadline, job_id) or pause))
            pause = min(pause * 2, RESUME_BACKOFF[1])

    def metrics(
        self,
        job_id: str,
        names: Iterable[str] = (),
        since: dt.datetime | str | None = None,
        *,
        after: int = 0,
    ) -> builtins.list[MetricRow]:
        """The job's metrics history, oldest first (also while it runs): only ``names`` when given
        (loss, val_loss, lr, tokens_per_s, step_time_s, ...), recorded at or after ``since``, past ``seq`` ``after``.
        """
        request = jobs_pb2.GetMetricsRequest(job_id=job_id, names=list(names), after=after)
        if since is not None:
            request.since.FromDatetime(utc(since))
        rows: builtins.list[MetricRow] = []
        while True:
            reply = self._call(self._client._jobs.GetMetrics, request)
            rows.extend(MetricRow.from_proto(p) for p in reply.points)
            if not reply.next_after:
                return rows
            request.after = reply.next_after

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[tuple[int, str]]:
        """(worker, line) pairs of the job's worker logs."""
        try:
            for line in self._client._jobs.ReadLogs(jobs_pb2.ReadLogsRequest(job_id=job_id, follow=follow)):
                yield line.worker, line.line
        except grpc.RpcError as err:
            raise self._client._error(err) from None


class JobHandle:
    """One submitted job."""

    def __init__(self, client: Client, job_id: str):
        self._client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def status(self) -> JobStatus:
        return self._client.jobs.get(self.id)

    def events(self, cursor: int = 0) -> Iterator[Event]:
        return self._client.jobs.events(self.id, cursor)

    def cancel(self) -> JobStatus:
        return self._client.jobs.cancel(self.id)

    def resume(self, **changes: int) -> JobHandle:
        """See :meth:`Jobs.resume` (``workers``, ``dp_shard``, ``tp``, ``dp_replicate``, ``steps``)."""
        return self._client.jobs.resume(self.id, **changes)

    def metrics(self, names: Iterable[str] = (), since: dt.datetime | str | None = None) -> builtins.list[MetricRow]:
        """This job's metrics history (``Jobs.metrics``)."""
        return self._client.jobs.metrics(self.id, names, since)

    def logs(self, *, follow: bool = False) -> Iterator[tuple[int, str]]:
        return self._client.jobs.logs(self.id, follow=follow)

    def wait(self, *, progress: bool = False, timeout: float | None = None) -> JobStatus:
        """Follow the job's events to its end; with ``progress``, show it on stderr (a bar on a terminal).

        ``timeout`` (seconds) holds whatever the server does (no events, down,
        frozen): past it, ``WaitTimedOut`` (a ``CantataError``) is raised.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        if progress:  # a bar on a terminal, plain lines elsewhere
            from cantata.sdk.progress import progress_display

            bar = progress_display(self.id)
        try:
            for event in self._client.jobs._watch(self.id, 0, deadline):
                if bar is not None:
                    bar.update(event)
                if event.terminal:
                    break
        finally:
            if bar is not None:
                bar.close()
        left = _left(deadline, self.id)
        timeout = self._client.timeout if left is None else min(left, self._client.timeout)
        try:
            info = self._client._jobs.GetJob(jobs_pb2.GetJobRequest(job_id=self.id), timeout=timeout)
        except grpc.RpcError as err:
            _left(deadline, self.id)  # the deadline passed during the call: a timeout, not an outage
            raise self._client._error(err) from None
        return JobStatus.from_proto(info)


def _states(state: str | Iterable[str]) -> builtins.list[common_pb2.JobState]:
    names = [name.upper() for name in ([state] if isinstance(state, str) else state) if name]
    unknown = [name for name in names if name not in STATE_NAMES]
    if unknown:
        raise InvalidArgument(f"state: one of {', '.join(STATE_NAMES)}, not {', '.join(unknown)}")
    return [common_pb2.JobState.Value(name) for name in names]


def _left(deadline: float | None, job_id: str) -> float | None:
    """Seconds until ``deadline`` (None: no deadline); ``WaitTimedOut`` once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise WaitTimedOut(f"timed out waiting for {job_id}", code=grpc.StatusCode.DEADLINE_EXCEEDED)
    return left
