"""The control plane's part, stood in for, when worker groups run the ``Decentralized`` strategy as plain processes.

The sharded-gossip test and benchmark start worker groups as
``torch.multiprocessing`` processes that gossip over real mutual-TLS
endpoints. What the server does for a job's workers is here instead: their
certificates and configs, and a peer directory (with the reports it would
record) kept in a table the processes share through a ``Manager``.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from cantata.proto.v1 import common_pb2
from cantata.security.pki import CertificateAuthority, Principal
from cantata.trainer.checkpoint import Scope, Stateful
from cantata.trainer.config import WorkerConfig
from cantata.trainer.gossip import gossip_server_name
from cantata.trainer.reporter import Peers


class Directory:
    """The control plane's peer directory and report sink, as a table the processes share."""

    def __init__(self, table: MutableMapping[tuple, Any], process: int):
        self._table, self._process = table, process
        self.stop_requested = False

    def gossip_endpoint(self, address: str, first_round: int = 0) -> None:
        self._table[("address", self._process)] = address

    def peers(self) -> Peers:
        items = dict(self._table)
        addresses = {key[1]: value for key, value in items.items() if key[0] == "address"}
        rounds = {key[1]: value for key, value in items.items() if key[0] == "round"}
        return Peers(addresses, 0, rounds, restarts={})  # nothing here is restarted

    def round(self, round_: int, peers: list[int], skipped: list[int], seconds: float, **figures: Any) -> None:
        self._table[("round", self._process)] = round_
        self._table[("report", self._process, round_)] = (list(peers), list(skipped), figures["bytes_sent"])

    def anomaly(self, peer: int, round_: int, check: str, verdict: str, score: float, quarantined: bool) -> None:
        self._table[("anomaly", self._process, peer, round_)] = (check, verdict)

    def message(self, text: str) -> None:
        pass

    def gossip_refused(self, address: str, principal: str, reason: str) -> None:
        self._table[("refused", self._process)] = principal


class Parts:
    """What ``Decentralized.prepare`` registers (the checkpoint registry's role; nothing is sealed here)."""

    def __init__(self) -> None:
        self.parts: dict[str, Stateful] = {}

    def register(self, name: str, scope: Scope, part: Stateful) -> None:
        self.parts[name] = part


def credentials(directory: Path, job: str, processes: int) -> dict[str, Path]:
    """A CA and a gossip certificate for each of ``job``'s worker processes, as files; their paths by name."""
    ca = CertificateAuthority.create()
    paths = {"ca": directory / "ca.pem"}
    paths["ca"].write_bytes(ca.cert_pem)
    for i in range(processes):
        bundle = ca.issue_bundle(
            Principal.worker(job, i), dns_names=[gossip_server_name(job, i)], lifetime=timedelta(hours=1), server=True
        )
        paths[f"cert{i}"], paths[f"key{i}"] = directory / f"cert{i}.pem", directory / f"key{i}.pem"
        paths[f"cert{i}"].write_bytes(bundle.cert_pem)
        paths[f"key{i}"].write_bytes(bundle.key_pem)
    return paths


def worker_config(
    job: str, process: int, spec: common_pb2.JobSpec, port: int, paths: dict[str, Path], attack: dict | None = None
) -> WorkerConfig:
    """Process ``process``'s config, as the launcher writes it: group g meets at ``port + g``; nothing is sealed."""
    group = process // spec.ranks_per_worker
    return WorkerConfig(
        job_id=job,
        tenant="t",
        worker=process,
        workers=spec.workers,
        attempt=0,
        server="",
        ca=paths["ca"],
        cert=paths[f"cert{process}"],
        key=paths[f"key{process}"],
        rendezvous=f"tcp://127.0.0.1:{port + group}",
        threads=1,
        spec=spec,
        checkpoint_keys=None,  # type: ignore[arg-type]
        dataset_access=None,  # type: ignore[arg-type]
        attack=attack,
    )
