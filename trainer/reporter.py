"""The worker's line to the control plane (the Worker service, over mutual TLS).

A call the server answers ``UNAVAILABLE`` (its audit log cannot be written, so
it recorded nothing) is sent again with exponential backoff for up to
``retry_for`` seconds, then fails as before: a worker outlives a short outage
of the server's disk and still dies of a long one rather than train unaudited.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from cantata.proto.v1 import worker_pb2, worker_pb2_grpc
from cantata.trainer.config import WorkerConfig

REPORT_TIMEOUT = 30.0
RETRY_FOR = 120.0  # seconds a call answered UNAVAILABLE is retried
FIRST_BACKOFF, MAX_BACKOFF = 0.5, 10.0

Reply = TypeVar("Reply")


def retry_unavailable(call: Callable[[], Reply], retry_for: float) -> Reply:
    """``call()``, again after 0.5, 1, 2 ... (at most 10) s while it fails with ``UNAVAILABLE``, for ``retry_for`` s."""
    deadline = time.monotonic() + retry_for
    delay = FIRST_BACKOFF
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, MAX_BACKOFF)


class Reporter:
    """Sends reports; ``stop_requested`` turns true once the server says the job is cancelling."""

    def __init__(self, cfg: WorkerConfig):
        credentials = grpc.ssl_channel_credentials(
            root_certificates=cfg.ca.read_bytes(),
            private_key=cfg.key.read_bytes(),
            certificate_chain=cfg.cert.read_bytes(),
        )
        self._channel = grpc.secure_channel(cfg.server, credentials)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        self._job_id, self._worker = cfg.job_id, cfg.worker
        self.stop_requested = False
        self.retry_for = RETRY_FOR

    def send(self, **payload) -> None:
        report = worker_pb2.WorkerReport(job_id=self._job_id, worker=self._worker, **payload)
        reply = retry_unavailable(
            lambda: self._stub.Report(report, timeout=REPORT_TIMEOUT, wait_for_ready=True), self.retry_for
        )
        self.stop_requested = self.stop_requested or reply.stop

    def started(self) -> None:
        self.send(started=True)

    def progress(self, step: int, loss: float, tokens_per_s: float, lr: float) -> None:
        self.send(progress=worker_pb2.Progress(step=step, loss=loss, tokens_per_s=tokens_per_s, lr=lr))

    def eval(self, step: int, val_loss: float) -> None:
        self.send(eval=worker_pb2.Eval(step=step, val_loss=val_loss))

    def checkpoint(self, step: int, uri: str, size_bytes: int) -> None:
        self.send(checkpoint=worker_pb2.CheckpointWritten(step=step, uri=uri, size_bytes=size_bytes))

    def message(self, text: str) -> None:
        self.send(message=worker_pb2.Message(text=text))

    def finished(self, final_val_loss: float) -> None:
        self.send(finished=worker_pb2.Finished(final_val_loss=final_val_loss))

    def failed(self, reason: str) -> None:
        self.send(failed=worker_pb2.Failed(reason=reason))

    def gossip_endpoint(self, address: str) -> None:
        self.send(gossip=worker_pb2.GossipEndpoint(address=address))

    def round(self, round_: int, peers: list[int], skipped: list[int], seconds: float) -> None:
        self.send(round=worker_pb2.Round(round=round_, peers=peers, skipped=skipped, seconds=seconds))

    def anomaly(self, peer: int, round_: int, check: str, verdict: str, score: float, quarantined: bool) -> None:
        self.send(
            anomaly=worker_pb2.Anomaly(
                peer=peer, round=round_, check=check, verdict=verdict, score=score, quarantined=quarantined
            )
        )

    def gossip_refused(self, address: str, principal: str, reason: str) -> None:
        self.send(refused=worker_pb2.GossipRefused(address=address, principal=principal, reason=reason))

    def peers(self) -> tuple[dict[int, str], int, dict[int, int]]:
        """The job's registered gossip endpoints, the latest finished round, and each worker's."""
        request = worker_pb2.GetPeersRequest(job_id=self._job_id)
        reply = retry_unavailable(
            lambda: self._stub.GetPeers(request, timeout=REPORT_TIMEOUT, wait_for_ready=True), self.retry_for
        )
        return dict(reply.peers), reply.round, dict(reply.rounds)

    def close(self) -> None:
        self._channel.close()
