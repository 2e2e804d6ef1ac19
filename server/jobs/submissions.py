"""Submissions written by one thread in batches: each job row with its audit record, group-committed.

``SubmitJob`` checks a submission on the event loop and hands it to
:class:`SubmitWriter`, whose thread takes every submission waiting and writes
them in one transaction, each a savepoint of it (a refused one is undone
alone), each with its ``job_submitted`` record written beside the commit
(:meth:`~cantata.server.request_audit.RequestAudit.append_alongside_commit`).
The transaction returns once the commit and the records are all durable; only
then are the calls answered, all of a batch with one wake of the event loop.
If the records cannot be made durable, every job of the batch is undone and
every call of it fails. A call waiting for its batch holds no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from cantata.proto.v1 import common_pb2
from cantata.security.audit import REQUEST_ID_DETAIL, Action
from cantata.server.errors import Unavailable
from cantata.server.request_audit import RequestAudit
from cantata.server.store import JobRecord, Store, Tenant

MAX_BATCH = 256  # submissions in one transaction

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Submission:
    """One checked submission, and what became of it."""

    tenant: str
    request_id: str
    spec: common_pb2.JobSpec
    digest: str  # of the spec as the tenant sent it
    actor: str  # the caller's principal URI
    peer: str
    call_id: str  # the request id of the call, named in the audit record
    future: asyncio.Future = field(repr=False)
    job: JobRecord | None = None
    created: bool = False
    error: BaseException | None = None


class SubmitWriter:
    """The one thread that writes submissions; ``start()``, then ``close()`` (once no call can submit)."""

    def __init__(self, store: Store, recorder: RequestAudit):
        self._store = store
        self._recorder = recorder
        self._queue: queue.SimpleQueue[Submission | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="submit-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._closed = True
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join()

    async def submit(
        self,
        tenant: str,
        request_id: str,
        spec: common_pb2.JobSpec,
        digest: str,
        *,
        actor: str,
        peer: str,
        call_id: str,
    ) -> tuple[JobRecord, bool]:
        """Write the job with its record (or find the one ``request_id`` made); return (job, created) once durable.

        Raises what the store raises for this submission (a quota, a reused request id), or, for the whole
        batch, why it could not be made durable and recorded (then no job of it stands).
        """
        if self._closed:
            raise Unavailable("the server is stopping; submit again")
        future = asyncio.get_running_loop().create_future()
        self._queue.put(Submission(tenant, request_id, spec, digest, actor, peer, call_id, future))
        return await future

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = [first], False
            with contextlib.suppress(queue.Empty):
                while len(batch) < MAX_BATCH:
                    item = self._queue.get_nowait()
                    if item is None:
                        stop = True
                        break
                    batch.append(item)
            try:
                self._write(batch)
            except Exception as exc:  # a fault of the writer itself: the calls fail, the thread goes on
                log.exception("the submit writer failed on a batch of %d", len(batch))
                for submission in batch:
                    submission.error = submission.error or Unavailable(f"the submission could not be written: {exc}")
            _answer(batch)
            if stop:
                return

    def _write(self, batch: Sequence[Submission]) -> None:
        """One transaction for the batch, each submission a savepoint of it; returns once all are durable."""
        database = self._store.database
        tenants: dict[str, Tenant] = {}  # read once per batch, in its transaction
        try:
            with database.transaction():
                for submission in batch:
                    try:
                        with database.transaction():
                            tenant = tenants.get(submission.tenant) or self._store.tenant(submission.tenant)
                            tenants[submission.tenant] = tenant
                            submission.job, submission.created = self._store.submit_job(
                                tenant,
                                submission.request_id,
                                submission.spec,
                                submission.digest,
                                record=partial(self._record, submission),
                            )
                    except Exception as exc:
                        submission.error, submission.created = exc, False
        except Exception as exc:  # not durable, or not recorded: every job of the batch was undone
            for submission in batch:
                submission.error = submission.error or exc
        finally:
            for submission in batch:
                if submission.created and submission.job is not None:
                    self._store.settled(submission.job.id)

    def _record(self, submission: Submission, job_id: str) -> int:
        """The job's ``job_submitted`` record, synced beside the commit; its seq."""
        spec = submission.spec
        return self._recorder.append_alongside_commit(
            submission.actor,
            Action.JOB_SUBMITTED,
            undo=lambda: self._store.undo_submission(job_id),
            resource=job_id,
            tenant=submission.tenant,
            details={
                "name": spec.name,
                "algorithm": spec.algorithm,
                "workers": spec.workers,
                "steps": spec.steps,
                REQUEST_ID_DETAIL: submission.call_id,
            },
            peer=submission.peer,
        ).seq


def _answer(batch: Sequence[Submission]) -> None:
    """Answer the calls of a batch: one wake of each event loop they wait on."""
    loops: dict[asyncio.AbstractEventLoop, list[Submission]] = {}
    for submission in batch:
        loops.setdefault(submission.future.get_loop(), []).append(submission)
    for loop, submissions in loops.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped, nobody waits
            loop.call_soon_threadsafe(_settle, submissions)


def _settle(submissions: Sequence[Submission]) -> None:
    for submission in submissions:
        if submission.future.done():  # the call was cancelled meanwhile
            continue
        if submission.error is not None:
            submission.future.set_exception(submission.error)
        else:
            submission.future.set_result((submission.job, submission.created))
