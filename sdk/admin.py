"""``client.admin``: platform administration other than the tenant lifecycle (scrapers, certificates, evaluation)."""

from __future__ import annotations

from dataclasses import dataclass

from cantata.proto.v1 import admin_pb2
from cantata.sdk.resource import Resource


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


class Admin(Resource):
    """``client.admin`` (admins)."""

    def add_scraper(self, name: str, csr_pem: bytes) -> admin_pb2.AddScraperReply:
        """An admin signs a Prometheus scraper's CSR: the reply holds its certificate and the /metrics address."""
        return self._call(self._client._admin.AddScraper, admin_pb2.AddScraperRequest(name=name, csr_pem=csr_pem))

    def revoke_certificate(self, serial: str, reason: str = "") -> str:
        """Refuse one certificate from now on; returns the principal it named."""
        reply = self._call(
            self._client._admin.RevokeCertificate, admin_pb2.RevokeCertificateRequest(serial=serial, reason=reason)
        )
        return reply.principal

    def simulate_attack(self, job_id: str, workers: list[int], attack: str, strength: float = 0.0) -> None:
        """Evaluation only (admins): make some workers of a queued job send malicious updates."""
        self._call(
            self._client._admin.SimulateAttack,
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
        workers: list[int] | None = None,
    ) -> None:
        """Evaluation only (admins): corrupt a queued job's loss at ``step`` (``loss_spike`` x ``scale``, or
        ``nonfinite``), ``times`` times, on ``workers`` (default all), to exercise its recovery policy."""
        self._call(
            self._client._admin.InjectFault,
            admin_pb2.InjectFaultRequest(
                job_id=job_id, fault=fault, step=step, scale=scale, times=times, workers=workers or []
            ),
        )

    def anomalies(self, job_id: str) -> list[Anomaly]:
        """Updates that the job's workers screened out (admins)."""
        reply = self._call(self._client._admin.ListAnomalies, admin_pb2.ListAnomaliesRequest(job_id=job_id))
        return [
            Anomaly(a.reporter, a.peer, a.round, a.check, a.verdict, a.score, a.quarantined, a.time)
            for a in reply.anomalies
        ]
