"""The worker's line to the control plane (the Worker service, over mutual TLS), and its heartbeat.

It needs only the light part of the worker's config (:class:`Endpoint`), so a
worker starts its heartbeat before it loads torch: that alone can take longer
than the server's heartbeat timeout on a busy node.

Reports go out in order from a background thread, through a bounded queue of
``MAX_PENDING`` reports, each numbered (``seq`` 1, 2, 3 ...): training does not
wait for the server. While the server is down (restarting, upgraded, killed) or
answers ``UNAVAILABLE`` (its audit log or its database cannot be written, a
full data disk: it recorded nothing), the head report is sent again with exponential backoff and the
others wait behind it; training goes on until the queue is full, then waits
too. The server applies each number once, so a report sent again because its
answer was lost is not applied twice, and nothing reported is lost. After
``retry_for`` seconds without an answer the worker gives up: the next report
raises, and the worker fails rather than train unaudited. ``finished`` and
``failed`` wait until everything before them is delivered, so a worker
exits only once the server knows how it ended. A heartbeat is not numbered and
not retried: the next beat is its retry.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import grpc

from cantata.proto.launch import WorkerLaunch
from cantata.proto.v1 import worker_pb2, worker_pb2_grpc
from cantata.trainer.recovery import Trip
from cantata.trainer.usage import Usage

REPORT_TIMEOUT = 30.0
HEARTBEAT_INTERVAL = 5.0  # seconds between heartbeats until the server's first reply says otherwise
RETRY_FOR = 900.0  # seconds a report is sent again while the server is down or UNAVAILABLE
MAX_PENDING = 1000  # reports buffered while the server is away; past this training waits for it
FIRST_BACKOFF, MAX_BACKOFF = 0.5, 10.0
# Try to reconnect to a server that went away every few seconds, not gRPC's default of up to 2 minutes.
RECONNECT = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 4000)]
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)  # the server is away, not refusing

Reply = TypeVar("Reply")


def retry_unavailable(
    call: Callable[[], Reply], retry_for: float, codes: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE,)
) -> Reply:
    """``call()``, again after 0.5, 1, 2 ... (at most 10) s while it fails with one of ``codes``, for ``retry_for`` s."""
    deadline = time.monotonic() + retry_for
    delay = FIRST_BACKOFF
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() not in codes or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, MAX_BACKOFF)


def optimizer_window(metrics: Mapping[str, float]) -> worker_pb2.OptimizerWindow:
    """``TrainingOptimizer.window_metrics()`` as its report: metric ``optim_<field>`` is field ``<field>``."""
    return worker_pb2.OptimizerWindow(**{name.removeprefix("optim_"): value for name, value in metrics.items()})


class ReportsLost(RuntimeError):
    """The server did not take the worker's reports (it refused one, or stayed away past ``retry_for``)."""


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom a worker reports: the fields of its config file the reporter reads."""

    server: str
    ca: Path
    cert: Path
    key: Path
    job_id: str
    worker: int

    @classmethod
    def of(cls, launch: WorkerLaunch) -> Endpoint:
        return cls(launch.server, Path(launch.ca), Path(launch.cert), Path(launch.key), launch.job_id, launch.worker)


class Peers(NamedTuple):
    """A job's workers as the control plane knows them (keyed by worker index)."""

    addresses: dict[int, str]  # registered gossip endpoints (a dead worker's is withdrawn)
    round: int  # the latest round any worker finished
    rounds: dict[int, int]  # the latest round each finished (0 also for none yet)
    restarts: dict[int, int]  # times the server restarted each


class Reporter:
    """Sends reports; ``stop_requested`` turns true once the server says the job is cancelling."""

    def __init__(self, endpoint: Endpoint):
        credentials = grpc.ssl_channel_credentials(
            root_certificates=endpoint.ca.read_bytes(),
            private_key=endpoint.key.read_bytes(),
            certificate_chain=endpoint.cert.read_bytes(),
        )
        self._channel = grpc.secure_channel(endpoint.server, credentials, options=RECONNECT)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        self._job_id, self._worker = endpoint.job_id, endpoint.worker
        self._heartbeat_interval = HEARTBEAT_INTERVAL
        self._closed = threading.Event()
        self._numbers = itertools.count(1)
        self._pending: collections.deque[worker_pb2.WorkerReport] = collections.deque()
        self._sending = False  # the head report is out, not yet answered
        self._error: ReportsLost | None = None
        self._changed = threading.Condition()
        self.stop_requested = False
        self.retry_for = RETRY_FOR
        self.max_pending = MAX_PENDING
        threading.Thread(target=self._send_pending, name="reports", daemon=True).start()

    def send(self, **payload) -> None:
        """Queue a report (numbered, sent in order); waits while ``max_pending`` are queued.

        Raises :class:`ReportsLost` once the server refused a report or stayed away past ``retry_for``.
        """
        with self._changed:
            self._changed.wait_for(lambda: self._error is not None or len(self._pending) < self.max_pending)
            if self._error is not None:
                raise self._error
            seq = next(self._numbers)
            self._pending.append(worker_pb2.WorkerReport(job_id=self._job_id, worker=self._worker, seq=seq, **payload))
            self._changed.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued report is delivered (False if ``timeout`` passed first).

        Raises :class:`ReportsLost` if one cannot be delivered.
        """
        with self._changed:
            done = self._changed.wait_for(
                lambda: self._error is not None or not (self._pending or self._sending), timeout
            )
            if self._error is not None:
                raise self._error
            return done

    def _send_pending(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._closed.is_set())
                if not self._pending:
                    return
                report, self._sending = self._pending[0], True
            try:
                reply = retry_unavailable(
                    lambda r=report: self._stub.Report(r, timeout=REPORT_TIMEOUT, wait_for_ready=True),  # type: ignore[misc]
                    self.retry_for,
                    RETRIED,
                )
            except (grpc.RpcError, ValueError) as exc:  # refused, away too long, or the channel closed at exit
                with self._changed:
                    self._error = ReportsLost(f"report {report.seq} ({report.WhichOneof('payload')}) not taken: {exc}")
                    self._sending = False
                    self._changed.notify_all()
                return
            self._answered(reply)
            with self._changed:
                self._pending.popleft()
                self._sending = False
                self._changed.notify_all()

    def _answered(self, reply: worker_pb2.WorkerReportReply) -> None:
        if reply.stop:
            self.stop_requested = True
        if reply.heartbeat_interval_s > 0:
            self._heartbeat_interval = reply.heartbeat_interval_s

    def start_heartbeat(self) -> None:
        """Report that this process lives, from a background thread, as often as the server asks, until ``close``.

        A process that is stopped or wedged stops beating with it, and the server kills it as hung. Each beat
        carries the process's CPU and memory use since the previous one (:class:`~cantata.trainer.usage.Usage`).
        """
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        usage = Usage()
        while not self._closed.is_set():
            beat = worker_pb2.WorkerReport(job_id=self._job_id, worker=self._worker, heartbeat=usage.heartbeat())
            # the server may be unreachable for now (the next beat tries again), or the channel closed at exit
            with contextlib.suppress(grpc.RpcError, ValueError):
                self._answered(self._stub.Report(beat, timeout=REPORT_TIMEOUT, wait_for_ready=True))
            self._closed.wait(self._heartbeat_interval)

    def started(self) -> None:
        self.send(started=True)

    def progress(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        lr: float,
        *,
        tokens: int = 0,
        step_time_s: float = 0.0,
        data_wait_s: float = 0.0,
        grad_norm: float | None = None,
        optimizer: Mapping[str, float] | None = None,
    ) -> None:
        """The report window ending at ``step``: its last loss, throughput and tokens, mean step time and data wait,
        and the optimizer's statistics (``TrainingOptimizer.window_metrics()``) when given."""
        self.send(
            progress=worker_pb2.Progress(
                step=step,
                loss=loss,
                tokens_per_s=tokens_per_s,
                lr=lr,
                tokens=tokens,
                step_time_s=step_time_s,
                data_wait_s=data_wait_s,
                grad_norm=grad_norm,
                optimizer=optimizer_window(optimizer) if optimizer is not None else None,
            )
        )

    def eval(self, step: int, val_loss: float) -> None:
        self.send(eval=worker_pb2.Eval(step=step, val_loss=val_loss))

    def checkpoint(self, step: int, uri: str, size_bytes: int, seconds: float = 0.0) -> None:
        self.send(checkpoint=worker_pb2.CheckpointWritten(step=step, uri=uri, size_bytes=size_bytes, seconds=seconds))

    def message(self, text: str) -> None:
        self.send(message=worker_pb2.Message(text=text))

    def store_unreachable(self, uri: str, cause: str, retry_for: float) -> None:
        """The checkpoint store at ``uri`` stopped answering; its calls are retried for up to ``retry_for`` s."""
        self.send(store_outage=worker_pb2.StoreOutage(uri=uri, cause=cause, retry_for_s=retry_for))

    def store_reachable(self, uri: str, seconds: float) -> None:
        """The checkpoint store at ``uri`` answers again, after an outage of ``seconds``."""
        self.send(store_outage=worker_pb2.StoreOutage(uri=uri, reachable=True, seconds=seconds))

    def rollback(self, step: int, checkpoint_step: int, trip: Trip, rollback: int, lr_scale: float) -> None:
        """A recovery policy rolled the job back from ``step`` to ``checkpoint_step``, tripped by ``trip``."""
        self.send(
            rollback=worker_pb2.Rollback(
                step=step,
                checkpoint_step=checkpoint_step,
                cause=str(trip.cause),
                loss=trip.loss,
                zscore=trip.zscore,
                skipped_from=checkpoint_step + 1,
                skipped_to=step,
                rollback=rollback,
                lr_scale=lr_scale,
            )
        )

    def finished(self, final_val_loss: float) -> None:
        """Report the end, and wait until the server has it and everything before it."""
        self.send(finished=worker_pb2.Finished(final_val_loss=final_val_loss))
        self.flush()

    def failed(self, reason: str, *, permanent: bool = False) -> None:
        """Report the failure, and wait until the server has it and everything before it."""
        self.send(failed=worker_pb2.Failed(reason=reason, permanent=permanent))
        self.flush()

    def gossip_endpoint(self, address: str, first_round: int = 0) -> None:
        self.send(gossip=worker_pb2.GossipEndpoint(address=address, first_round=first_round))

    def round(
        self,
        round_: int,
        peers: list[int],
        skipped: list[int],
        seconds: float,
        *,
        inner_steps: int = 0,
        bytes_sent: int = 0,
        deadline_s: float = 0.0,
        step_time_s: float = 0.0,
        traffic: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        """One round as this worker saw it; ``traffic``: peer -> (payload bytes sent, received) in the round."""
        self.send(
            round=worker_pb2.Round(
                round=round_,
                peers=peers,
                skipped=skipped,
                seconds=seconds,
                inner_steps=inner_steps,
                bytes_sent=bytes_sent,
                deadline_s=deadline_s,
                step_time_s=step_time_s,
                traffic=[
                    worker_pb2.PeerTraffic(peer=p, bytes_sent=sent, bytes_received=received)
                    for p, (sent, received) in sorted((traffic or {}).items())
                ],
            )
        )

    def anomaly(self, peer: int, round_: int, check: str, verdict: str, score: float, quarantined: bool) -> None:
        self.send(
            anomaly=worker_pb2.Anomaly(
                peer=peer, round=round_, check=check, verdict=verdict, score=score, quarantined=quarantined
            )
        )

    def gossip_refused(self, address: str, principal: str, reason: str) -> None:
        self.send(refused=worker_pb2.GossipRefused(address=address, principal=principal, reason=reason))

    def peers(self) -> Peers:
        """The job's gossip peers as the control plane knows them now (see :class:`Peers`).

        Asked once this worker's own reports (its endpoint among them) are delivered; sent again while the server is away.
        """
        self.flush()
        request = worker_pb2.GetPeersRequest(job_id=self._job_id)
        reply = retry_unavailable(
            lambda: self._stub.GetPeers(request, timeout=REPORT_TIMEOUT, wait_for_ready=True), self.retry_for, RETRIED
        )
        return Peers(dict(reply.peers), reply.round, dict(reply.rounds), dict(reply.restarts))

    def close(self, wait: float | None = None) -> None:
        """Deliver what is queued (for at most ``wait`` seconds, else as long as ``retry_for`` allows), then stop."""
        with contextlib.suppress(ReportsLost):
            self.flush(wait)
        with self._changed:
            self._closed.set()
            self._changed.notify_all()
        self._channel.close()
