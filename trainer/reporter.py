"""The worker's line to the control plane (the Worker service, over mutual TLS)."""

from __future__ import annotations

import grpc

from cantata.proto.v1 import worker_pb2, worker_pb2_grpc
from cantata.trainer.config import WorkerConfig

REPORT_TIMEOUT = 30.0


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

    def send(self, **payload) -> None:
        report = worker_pb2.WorkerReport(job_id=self._job_id, worker=self._worker, **payload)
        reply = self._stub.Report(report, timeout=REPORT_TIMEOUT, wait_for_ready=True)
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

    def failed(self, reason: str, *, permanent: bool = False) -> None:
        self.send(failed=worker_pb2.Failed(reason=reason, permanent=permanent))

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
        reply = self._stub.GetPeers(
            worker_pb2.GetPeersRequest(job_id=self._job_id), timeout=REPORT_TIMEOUT, wait_for_ready=True
        )
        return dict(reply.peers), reply.round, dict(reply.rounds)

    def close(self) -> None:
        self._channel.close()
