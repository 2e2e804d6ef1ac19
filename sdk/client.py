"""``Client`` and ``JobHandle``: the tenant's and admin's typed view of the control plane."""

from __future__ import annotations

import builtins
import datetime as dt
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import grpc

from cantata.proto.datasource_rules import credentials_problem, dataset_key_problem
from cantata.proto.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    common_pb2,
    dashboard_pb2,
    dashboard_pb2_grpc,
    datasources_pb2,
    datasources_pb2_grpc,
    jobs_pb2,
    jobs_pb2_grpc,
    webhooks_pb2_grpc,
)
from cantata.proto.vocabulary import (
    BYTE_GPTS,
    MODEL_SHAPES,
    STATE_NAMES,
    Model,
    is_terminal,
    model_architecture,
)
from cantata.sdk.errors import (
    CantataError,
    InvalidArgument,
    InvalidJob,
    NotFound,
    StreamInterrupted,
    Unavailable,
    WaitTimedOut,
    from_rpc_error,
)
from cantata.sdk.profiles import Profile
from cantata.sdk.sweeps import Sweeps
from cantata.sdk.webhooks import Webhooks

if TYPE_CHECKING:  # the job-field table loads only for a submit
    from cantata.sdk.job import Job

TIMEOUT = 30.0
RESUME_WINDOW = 120.0  # seconds a dropped event stream is resumed for before StreamInterrupted
RESUME_BACKOFF = (0.2, 5.0)  # first and longest pause between attempts to resume a stream
# gRPC's own reconnect backoff grows to 120 s: cap it so a restarted server is found within seconds.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
]
MAX_REQUEST_BYTES = 4 << 20
DATA_SOURCE_KINDS = {"s3": datasources_pb2.S3, "az": datasources_pb2.AZURE_BLOB}
DATA_SOURCE_KIND_NAMES = {value: name for name, value in DATA_SOURCE_KINDS.items()}
CHECKPOINT_FORMATS = ("torch", "safetensors", "hf")
CHECKPOINT_FORMAT_GROUP = "cantata.checkpoint_formats"  # entry points: format name -> converter(state, out, config)


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
    """One point of a job's metrics history (``Client.metrics``); ``peer`` only for per-peer metrics."""

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


@dataclass(frozen=True)
class Checkpoint:
    job_id: str
    step: int
    size_bytes: int
    created: str


@dataclass(frozen=True)
class Anomaly:
    reporter: int
    peer: int
    round: int
    check: str
    verdict: str
    score: float
    quarantined: bool
    time: str


@dataclass(frozen=True)
class KeyRotation:
    version: int
    objects_rewrapped: int
    retired: list[int]


@dataclass(frozen=True)
class AuditEvent:
    """One audit record as the lookup shows it; ``request_id`` is the id the client saw in the reply."""

    seq: int
    time: str
    actor: str
    action: str
    resource: str
    tenant: str
    outcome: str
    peer: str
    request_id: str
    details: dict

    @classmethod
    def from_proto(cls, e: audit_pb2.AuditEvent) -> AuditEvent:
        return cls(
            e.seq,
            e.time,
            e.actor,
            e.action,
            e.resource,
            e.tenant,
            e.outcome,
            e.peer,
            e.request_id,
            json.loads(e.details_json or "{}"),
        )


@dataclass(frozen=True)
class AuditReport:
    intact: bool
    verdict: str
    content: str


@dataclass(frozen=True)
class Tenant:
    name: str
    status: str
    fingerprint: str
    max_concurrent_jobs: int
    max_workers_per_job: int
    max_total_steps: int
    running_jobs: int
    approved_by: str
    certificate_serial: str
    certificate_expires: str
    retention_days: int = 0
    max_gpus: int = 0

    @classmethod
    def from_proto(cls, t: admin_pb2.TenantInfo) -> Tenant:
        return cls(
            t.name,
            t.status,
            t.csr_fingerprint,
            t.quota.max_concurrent_jobs,
            t.quota.max_workers_per_job,
            t.quota.max_total_steps,
            t.running_jobs,
            t.approved_by,
            t.certificate_serial,
            t.certificate_expires,
            t.retention_days,
            t.quota.max_gpus,
        )


@dataclass(frozen=True)
class DataSource:
    """A registered data source as its tenant sees it: never its secrets."""

    name: str
    kind: str
    endpoint: str
    has_dataset_key: bool
    created: str

    @classmethod
    def from_proto(cls, info: datasources_pb2.DataSourceInfo) -> DataSource:
        return cls(
            info.name,
            DATA_SOURCE_KIND_NAMES[info.kind],
            info.endpoint,
            info.has_dataset_key,
            info.created.ToJsonString(),
        )


def data_source_request(
    name: str, kind: str, endpoint: str, credentials: dict[str, str], dataset_key: bytes | None, replace: bool
) -> datasources_pb2.RegisterDataSourceRequest:
    """A registration request, refusing what is wrong before it is sent (the server checks it all again)."""
    refused = credentials_problem(kind, credentials) or dataset_key_problem(dataset_key)
    if refused:
        raise InvalidArgument(refused)
    field, message = (
        ("s3", datasources_pb2.S3Credentials) if kind == "s3" else ("azure", datasources_pb2.AzureCredentials)
    )
    return datasources_pb2.RegisterDataSourceRequest(
        name=name,
        kind=DATA_SOURCE_KINDS[kind],
        endpoint=endpoint,
        dataset_key=dataset_key or b"",
        replace=replace,
        **{field: message(**credentials)},
    )


@dataclass(frozen=True)
class DashboardLogin:
    """A login link for the web dashboard: usable once, until ``expires``."""

    url: str
    expires: dt.datetime


def _submit_request(job: Job, *, dry_run: bool = False) -> jobs_pb2.SubmitJobRequest:
    """``job``'s submission, checked here first (its fields, its size)."""
    job.validate()
    request = jobs_pb2.SubmitJobRequest(request_id=job.request_id, spec=job.to_proto(), dry_run=dry_run)
    if request.ByteSize() > MAX_REQUEST_BYTES:
        raise InvalidJob(f"request of {request.ByteSize()} bytes exceeds {MAX_REQUEST_BYTES}", field="request")
    return request


def _read(path_or_pem: str | os.PathLike | bytes) -> bytes:
    return path_or_pem if isinstance(path_or_pem, bytes) else Path(path_or_pem).read_bytes()


class Client:
    """A connection to a Cantata server with one identity (a profile's certificate)."""

    def __init__(
        self,
        address: str,
        *,
        ca,
        cert=None,
        key=None,
        timeout: float = TIMEOUT,
        resume_window: float = RESUME_WINDOW,
        profile: str = "",
    ):
        """``timeout`` bounds each call; ``resume_window`` is how long ``events()`` resumes a dropped stream;
        ``profile`` is the name of the profile the identity came from (errors name it)."""
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(ca),
            private_key=_read(key) if key is not None else None,
            certificate_chain=_read(cert) if cert is not None else None,
        )
        self.address = address
        self.profile = profile
        self.timeout = timeout
        self.resume_window = resume_window
        self._channel = grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
        self._jobs = jobs_pb2_grpc.JobsStub(self._channel)
        self._checkpoints = checkpoints_pb2_grpc.CheckpointsStub(self._channel)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._audit = audit_pb2_grpc.AuditStub(self._channel)
        self._data_sources = datasources_pb2_grpc.DataSourcesStub(self._channel)
        self._dashboard = dashboard_pb2_grpc.DashboardStub(self._channel)
        self.webhooks = Webhooks(webhooks_pb2_grpc.WebhooksStub(self._channel), self._call)
        self.sweeps = Sweeps(self._channel, timeout)

    @classmethod
    def from_profile(cls, name: str, **kwargs) -> Client:
        profile = Profile.named(name)
        if not profile.exists:
            raise FileNotFoundError(f"no profile {name!r} under {profile.folder.parent}")
        if not profile.cert.exists():
            raise FileNotFoundError(f"profile {name!r} has no certificate yet: run `cantata tenant status {name}`")
        return cls(profile.server, ca=profile.ca, cert=profile.cert, key=profile.key, profile=name, **kwargs)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _error(self, err: grpc.RpcError) -> CantataError:
        """The SDK's error for ``err``; one that reached no server says where the call went."""
        profile = f" (profile {self.profile})" if self.profile else ""
        return from_rpc_error(err, target=f"the Cantata server at {self.address}{profile}")

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise self._error(err) from None

    # ---- jobs ----------------------------------------------------------
    def submit(self, job: Job) -> JobHandle:
        """Submit ``job``. Retrying with the same ``job.request_id`` returns the same job."""
        request = _submit_request(job)
        for attempt in range(3):
            try:
                info = self._jobs.SubmitJob(request, timeout=self.timeout)
                return JobHandle(self, info.id)
            except grpc.RpcError as err:
                error = self._error(err)
                if not isinstance(error, Unavailable) or attempt == 2:
                    raise error from None
                time.sleep(0.5 * 2**attempt)  # idempotent: safe to retry
        raise AssertionError("unreachable")

    def check(self, job: Job) -> dict[str, Any]:
        """What ``submit(job)`` would run, without creating it: the server checks it as a submission (its fields,
        the server's defaults, your data sources and quotas) and answers with every job field as it would run."""
        from cantata.proto import jobfields

        info = self._call(self._jobs.SubmitJob, _submit_request(job, dry_run=True))
        fields = {f.name: getattr(info.spec, f.name) for f in jobfields.FIELDS}
        return {
            name: list(value) if not isinstance(value, (str, int, float, bool)) else value
            for name, value in fields.items()
        }

    def get(self, job_id: str) -> JobStatus:
        return JobStatus.from_proto(self._call(self._jobs.GetJob, jobs_pb2.GetJobRequest(job_id=job_id)))

    def job(self, job_id: str) -> JobHandle:
        return JobHandle(self, job_id)

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
            request.since.FromDatetime(_utc(since))
        jobs = []
        while True:
            reply = self._call(self._jobs.ListJobs, request)
            jobs += [JobStatus.from_proto(j) for j in reply.jobs]
            request.page_token = reply.next_page_token
            if not request.page_token:
                return jobs

    def cancel(self, job_id: str) -> JobStatus:
        return JobStatus.from_proto(self._call(self._jobs.CancelJob, jobs_pb2.CancelJobRequest(job_id=job_id)))

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
        info = self._call(self._jobs.ResumeJob, request)
        return JobHandle(self, info.id)

    def delete(self, job_id: str) -> int:
        """Delete an ended job: its records, logs and checkpoints (audited); returns the checkpoint objects removed.

        A job that has not ended is refused with ``Conflict``; afterwards the job is ``NotFound``.
        """
        reply = self._call(self._jobs.DeleteJob, jobs_pb2.DeleteJobRequest(job_id=job_id))
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
                stream = self._jobs.WatchJob(request, timeout=_left(deadline, job_id))
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
                error = self._error(err)
                if not isinstance(error, Unavailable):
                    raise error from None
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            window_left = down_since + self.resume_window - now
            if window_left <= 0:
                raise StreamInterrupted(
                    f"event stream of {job_id} dropped after event {cursor} and not resumed "
                    f"within {self.resume_window:g} s"
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
            request.since.FromDatetime(_utc(since))
        rows: builtins.list[MetricRow] = []
        while True:
            reply = self._call(self._jobs.GetMetrics, request)
            rows.extend(MetricRow.from_proto(p) for p in reply.points)
            if not reply.next_after:
                return rows
            request.after = reply.next_after

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[tuple[int, str]]:
        """(worker, line) pairs of the job's worker logs."""
        try:
            for line in self._jobs.ReadLogs(jobs_pb2.ReadLogsRequest(job_id=job_id, follow=follow)):
                yield line.worker, line.line
        except grpc.RpcError as err:
            raise self._error(err) from None

    # ---- checkpoints ---------------------------------------------------
    def checkpoints(self, job_id: str) -> builtins.list[Checkpoint]:
        reply = self._call(self._checkpoints.ListCheckpoints, checkpoints_pb2.ListCheckpointsRequest(job_id=job_id))
        return [Checkpoint(c.job_id, c.step, c.size_bytes, c.created.ToJsonString()) for c in reply.checkpoints]

    def download_checkpoint(
        self,
        job_id: str,
        step: int | None,
        path: str | os.PathLike,
        *,
        format: str = "torch",
        consolidate: bool = False,
    ) -> Path:
        """Stream checkpoint ``step``'s model state (None: the latest checkpoint) to ``path``, verifying its digest.

        ``format="torch"`` writes the state dict as ``torch.save`` made it; ``"safetensors"`` makes
        ``path`` a directory holding ``model.safetensors`` and ``config.json`` (the model's shape), which
        load with ``safetensors`` and ``torch`` alone (converting needs both installed here).
        ``"hf"`` makes it a Hugging Face Llama or Qwen3 folder (a decoder's only), which
        ``transformers.AutoModelForCausalLM.from_pretrained`` loads.
        ``consolidate=True`` (with ``"torch"``, implies ``"safetensors"``) also takes a mesh job's sharded
        checkpoint: every rank's shards are joined here into full tensors, one ``model.safetensors``.
        """
        if format not in CHECKPOINT_FORMATS:
            raise InvalidArgument(f"format: one of {', '.join(CHECKPOINT_FORMATS)}, not {format!r}")
        if consolidate and format == "torch":
            format = "safetensors"
        if step is None:
            steps = [c.step for c in self.checkpoints(job_id)]
            if not steps:
                raise NotFound(f"job {job_id!r} has no checkpoint yet")
            step = steps[-1]
        if format == "torch":
            return self._download_state(job_id, step, Path(path), consolidate=False)
        convert = _checkpoint_converter(format)
        info = self._call(self._jobs.GetJob, jobs_pb2.GetJobRequest(job_id=job_id))
        if format == "hf" and Model(info.spec.model) in BYTE_GPTS:
            raise InvalidArgument(f"format hf: {info.spec.model} is a byte GPT; hf takes the Llama/Qwen3 decoders")
        out = Path(path)
        state = self._download_state(job_id, step, out.with_name(out.name + ".state"), consolidate=consolidate)
        try:
            return convert(state, out, checkpoint_config(info.spec.model, job_id=job_id, step=step))
        finally:
            _remove(state)

    def _download_state(self, job_id: str, step: int, path: Path, *, consolidate: bool) -> Path:
        """The model state as one file, or (a sharded checkpoint, consolidating) a directory of its objects."""
        tmp = path.with_name(path.name + ".part")
        digest = hashlib.sha256()
        expected = ""
        try:
            with ExitStack() as files:  # a sharded checkpoint: one file per object, under the directory
                sink: IO[bytes] | None = None
                request = checkpoints_pb2.DownloadCheckpointRequest(job_id=job_id, step=step, consolidate=consolidate)
                for chunk in self._checkpoints.DownloadCheckpoint(request, timeout=max(self.timeout, 600)):
                    if chunk.object:
                        tmp.mkdir(exist_ok=True)
                        sink = files.enter_context(open(tmp / _object_file(chunk.object), "wb"))
                    elif sink is None:
                        sink = files.enter_context(open(tmp, "wb"))
                    sink.write(chunk.data)
                    digest.update(chunk.data)
                    expected = chunk.sha256 or expected
        except grpc.RpcError as err:
            _remove(tmp)
            raise self._error(err) from None
        if expected != digest.hexdigest():
            _remove(tmp)
            raise StreamInterrupted(f"download of {job_id}@{step} was incomplete or corrupted")
        if tmp.is_dir() and path.is_dir():  # our own ``OUT.state`` left by an earlier download
            shutil.rmtree(path)
        tmp.replace(path)
        return path

    # ---- data sources --------------------------------------------------
    def register_data_source(
        self,
        name: str,
        *,
        kind: str,
        endpoint: str = "",
        credentials: dict[str, str],
        dataset_key: bytes | None = None,
        replace: bool = False,
    ) -> DataSource:
        """Register S3 (``kind="s3"``) or Azure Blob (``"az"``) credentials under ``name`` for this tenant's jobs.

        ``credentials`` holds S3's ``access_key_id``, ``secret_access_key`` and
        optional ``session_token`` and ``region``, or Azure's
        ``connection_string``, or ``account_name`` with ``account_key``, or
        ``sas_token``. ``dataset_key`` (the tenant's 32-byte key) lets the
        jobs' workers read shards uploaded encrypted. An existing name is a
        ``Conflict`` unless ``replace``.
        """
        request = data_source_request(name, kind, endpoint, credentials, dataset_key, replace)
        return DataSource.from_proto(self._call(self._data_sources.RegisterDataSource, request))

    def data_sources(self) -> builtins.list[DataSource]:
        reply = self._call(self._data_sources.ListDataSources, datasources_pb2.ListDataSourcesRequest())
        return [DataSource.from_proto(s) for s in reply.sources]

    def delete_data_source(self, name: str) -> None:
        self._call(self._data_sources.DeleteDataSource, datasources_pb2.DeleteDataSourceRequest(name=name))

    # ---- audit ---------------------------------------------------------
    def audit_report(self, *, tenant: str = "", since: str = "", until: str = "", fmt: str = "text") -> AuditReport:
        """A verified audit report: a tenant gets its own records, an admin any tenant's or all."""
        reply = self._call(
            self._audit.GetReport, audit_pb2.GetReportRequest(tenant=tenant, since=since, until=until, format=fmt)
        )
        return AuditReport(reply.intact, reply.verdict, reply.content)

    def audit_events(
        self,
        *,
        tenant: str = "",
        action: str = "",
        since: dt.datetime | str | None = None,
        until: dt.datetime | str | None = None,
        request_id: str = "",
        page_size: int = 500,
    ) -> Iterator[AuditEvent]:
        """Individual audit records, oldest first, filtered like CloudTrail's lookup (filters combine with AND).

        A tenant sees only its own records; an admin any tenant's (``tenant``) or all. ``since`` is
        inclusive, ``until`` exclusive. The records are read, not proven: ``audit report`` verifies.
        """
        request = audit_pb2.ListEventsRequest(
            tenant=tenant,
            action=action,
            since=_utc(since).isoformat() if since is not None else "",
            until=_utc(until).isoformat() if until is not None else "",
            request_id=request_id,
            page_size=page_size,
        )
        while True:
            reply = self._call(self._audit.ListEvents, request)
            yield from (AuditEvent.from_proto(e) for e in reply.events)
            request.page_token = reply.next_page_token
            if not request.page_token:
                return

    # ---- web dashboard ---------------------------------------------------
    def dashboard_login(self) -> DashboardLogin:
        """A one-time link that signs a browser in to the web dashboard as this client's principal."""
        reply = self._call(self._dashboard.CreateDashboardLogin, dashboard_pb2.CreateDashboardLoginRequest())
        return DashboardLogin(reply.url, reply.expires.ToDatetime(tzinfo=dt.UTC))

    # ---- administration ------------------------------------------------
    def add_scraper(self, name: str, csr_pem: bytes) -> admin_pb2.AddScraperReply:
        """An admin signs a Prometheus scraper's CSR: the reply holds its certificate and the /metrics address."""
        return self._call(self._admin.AddScraper, admin_pb2.AddScraperRequest(name=name, csr_pem=csr_pem))

    def tenants(self, status: str = "") -> builtins.list[Tenant]:
        reply = self._call(self._admin.ListTenants, admin_pb2.ListTenantsRequest(status=status))
        return [Tenant.from_proto(t) for t in reply.tenants]

    def approve_tenant(
        self,
        name: str,
        fingerprint: str,
        *,
        max_concurrent_jobs: int = 0,
        max_workers_per_job: int = 0,
        max_total_steps: int = 0,
        max_gpus: int = 0,
    ) -> Tenant:
        quota = common_pb2.Quota(
            max_concurrent_jobs=max_concurrent_jobs,
            max_workers_per_job=max_workers_per_job,
            max_total_steps=max_total_steps,
            max_gpus=max_gpus,
        )
        request = admin_pb2.ApproveTenantRequest(name=name, csr_fingerprint=fingerprint, quota=quota)
        return Tenant.from_proto(self._call(self._admin.ApproveTenant, request))

    def set_quota(
        self,
        name: str,
        *,
        max_concurrent_jobs: int = 0,
        max_workers_per_job: int = 0,
        max_total_steps: int = 0,
        max_gpus: int = 0,
    ) -> Tenant:
        """Change a tenant's limits; zero keeps a limit as it is."""
        quota = common_pb2.Quota(
            max_concurrent_jobs=max_concurrent_jobs,
            max_workers_per_job=max_workers_per_job,
            max_total_steps=max_total_steps,
            max_gpus=max_gpus,
        )
        return Tenant.from_proto(self._call(self._admin.SetQuota, admin_pb2.SetQuotaRequest(name=name, quota=quota)))

    def set_retention(self, name: str, days: int) -> Tenant:
        """Keep a tenant's ended jobs ``days`` days; the server then deletes them, audited (0: keep them)."""
        request = admin_pb2.SetRetentionRequest(name=name, retention_days=days)
        return Tenant.from_proto(self._call(self._admin.SetRetention, request))

    def revoke_certificate(self, serial: str, reason: str = "") -> str:
        """Refuse one certificate from now on; returns the principal it named."""
        reply = self._call(
            self._admin.RevokeCertificate, admin_pb2.RevokeCertificateRequest(serial=serial, reason=reason)
        )
        return reply.principal

    def rotate_tenant_key(self, tenant: str, *, retire_unused: bool = False) -> KeyRotation:
        """New key version for ``tenant``; stored checkpoints are re-wrapped, bodies untouched."""
        reply = self._call(
            self._admin.RotateTenantKey, admin_pb2.RotateTenantKeyRequest(tenant=tenant, retire_unused=retire_unused)
        )
        return KeyRotation(reply.version, reply.objects_rewrapped, list(reply.retired))

    def simulate_attack(self, job_id: str, workers: builtins.list[int], attack: str, strength: float = 0.0) -> None:
        """Evaluation only (admins): make some workers of a queued job send malicious updates."""
        self._call(
            self._admin.SimulateAttack,
            admin_pb2.SimulateAttackRequest(job_id=job_id, workers=workers, attack=attack, strength=strength),
        )

    def inject_fault(
        self,
        job_id: str,
        fault: str,
        step: int,
        *,
        scale: float = 0.0,
        times: int = 0,
        workers: builtins.list[int] | None = None,
    ) -> None:
        """Evaluation only (admins): corrupt a queued job's loss at ``step`` (``loss_spike`` x ``scale``, or
        ``nonfinite``), ``times`` times, on ``workers`` (default all), to exercise its recovery policy."""
        self._call(
            self._admin.InjectFault,
            admin_pb2.InjectFaultRequest(
                job_id=job_id, fault=fault, step=step, scale=scale, times=times, workers=workers or []
            ),
        )

    def anomalies(self, job_id: str) -> builtins.list[Anomaly]:
        """Updates that the job's workers screened out (admins)."""
        reply = self._call(self._admin.ListAnomalies, admin_pb2.ListAnomaliesRequest(job_id=job_id))
        return [
            Anomaly(a.reporter, a.peer, a.round, a.check, a.verdict, a.score, a.quarantined, a.time)
            for a in reply.anomalies
        ]

    def _tenant_action(self, method, name: str, reason: str) -> Tenant:
        return Tenant.from_proto(self._call(method, admin_pb2.TenantActionRequest(name=name, reason=reason)))

    def reject_tenant(self, name: str, reason: str = "") -> Tenant:
        return self._tenant_action(self._admin.RejectTenant, name, reason)

    def suspend_tenant(self, name: str, reason: str = "") -> Tenant:
        return self._tenant_action(self._admin.SuspendTenant, name, reason)

    def resume_tenant(self, name: str, reason: str = "") -> Tenant:
        return self._tenant_action(self._admin.ResumeTenant, name, reason)


class JobHandle:
    """One submitted job."""

    def __init__(self, client: Client, job_id: str):
        self._client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def status(self) -> JobStatus:
        return self._client.get(self.id)

    def events(self, cursor: int = 0) -> Iterator[Event]:
        return self._client.events(self.id, cursor)

    def cancel(self) -> JobStatus:
        return self._client.cancel(self.id)

    def resume(self, **changes: int) -> JobHandle:
        """See :meth:`Client.resume` (``workers``, ``dp_shard``, ``tp``, ``dp_replicate``, ``steps``)."""
        return self._client.resume(self.id, **changes)

    def metrics(self, names: Iterable[str] = (), since: dt.datetime | str | None = None) -> builtins.list[MetricRow]:
        """This job's metrics history (``Client.metrics``)."""
        return self._client.metrics(self.id, names, since)

    def logs(self, *, follow: bool = False) -> Iterator[tuple[int, str]]:
        return self._client.logs(self.id, follow=follow)

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
            for event in self._client._watch(self.id, 0, deadline):
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


def checkpoint_config(model: str, *, job_id: str, step: int) -> dict[str, object]:
    """The ``config.json`` of a downloaded checkpoint: the architecture and shape of ``model``, the job and the step."""
    return {
        "architecture": model_architecture(Model(model)),
        "model": model,
        **MODEL_SHAPES[Model(model)],
        "job_id": job_id,
        "step": step,
    }


def _object_file(name: str) -> str:
    """A streamed object's file name: the server's object names are plain, but never trusted as paths."""
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise StreamInterrupted(f"the server named an object {name!r}")
    return name


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _checkpoint_converter(format: str):
    """The installed converter to ``format`` (entry point group ``cantata.checkpoint_formats``; it needs torch)."""
    found = entry_points(group=CHECKPOINT_FORMAT_GROUP, name=format)
    try:
        return next(iter(found)).load()
    except (StopIteration, ImportError) as exc:
        raise InvalidArgument(
            f"format {format!r} needs the trainer's dependencies (torch, safetensors): "
            f"pip install 'cantata[trainer]' ({exc or 'no converter installed'})"
        ) from None


def _states(state: str | Iterable[str]) -> builtins.list[common_pb2.JobState]:
    names = [name.upper() for name in ([state] if isinstance(state, str) else state) if name]
    unknown = [name for name in names if name not in STATE_NAMES]
    if unknown:
        raise InvalidArgument(f"state: one of {', '.join(STATE_NAMES)}, not {', '.join(unknown)}")
    return [common_pb2.JobState.Value(name) for name in names]


def _utc(moment: dt.datetime | str) -> dt.datetime:
    """A time as an aware UTC datetime; naive times and ISO 8601 text without a zone are UTC."""
    if isinstance(moment, str):
        try:
            moment = dt.datetime.fromisoformat(moment)
        except ValueError:
            raise InvalidArgument(f"not an ISO 8601 time: {moment!r}") from None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def _left(deadline: float | None, job_id: str) -> float | None:
    """Seconds until ``deadline`` (None: no deadline); ``WaitTimedOut`` once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise WaitTimedOut(f"timed out waiting for {job_id}", code=grpc.StatusCode.DEADLINE_EXCEEDED)
    return left
