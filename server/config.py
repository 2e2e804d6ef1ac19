"""The server's data directory: its layout and its ``server.json`` settings.

D/server.json        settings written by ``cantata server init``
D/ca.pem, D/ca.key   the platform CA (key mode 0600)
D/trust.pem          CA certificates accepted from clients (reloaded on change)
D/server.pem/.key    the server's TLS certificate
D/state.db           SQLite control-plane state
D/master.key         master key of the tenant keyring (0600), unless $CANTATA_MASTER_KEY is set
D/keyring.sealed     tenants' key-encryption keys, encrypted under the master key
D/audit/             tamper-evident audit log and its signing keys
D/jobs/<job-id>/     per-job workspaces (worker configs, certificates, logs)
D/checkpoints/       the default local checkpoint store
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cantata.security.keys import MASTER_KEY_ENV, LocalKeyring, MasterKey

CONFIG_NAME = "server.json"
RETIRED_SETTINGS = frozenset({"max_job_attempts"})  # read from older server.json files and ignored


@dataclass
class ServerSettings:
    """What ``server init`` records and ``server start`` uses."""

    listen: str = "127.0.0.1:7443"  # mutual TLS: every service
    enroll_listen: str = ""  # server-authenticated TLS: enrollment only; default port + 1
    max_workers_on_node: int = 8  # worker processes this node runs at once
    default_quota: dict = field(
        default_factory=lambda: {"max_concurrent_jobs": 4, "max_workers_per_job": 8, "max_total_steps": 100_000}
    )
    allowed_roots: list[str] = field(default_factory=list)  # extra file:// roots for stores and data
    cancel_grace_seconds: float = 5.0
    worker_cert_hours: float = 72.0
    tenant_cert_days: int = 30
    revoke_quarantined_workers: bool = False  # policy when a worker is quarantined for gradient anomalies
    max_worker_restarts: int = 10  # upper bound on every job's max_failures (decentralized: restarts per worker)
    restart_backoff_seconds: float = 1.0  # wait before a job's first restart after a failure; doubles each time
    restart_backoff_max_seconds: float = 30.0  # the longest wait between restarts
    orphan_upload_seconds: float = 3600.0  # unfinished uploads older than this in a checkpoint store are removed
    orphan_sweep_seconds: float = 600.0  # how often the checkpoint stores are swept for them
    retention_sweep_seconds: float = 3600.0  # how often ended jobs past their tenant's retention are deleted
    worker_heartbeat_timeout_s: float = 60.0  # a worker silent this long is hung: it is killed


def enrollment_address(listen: str) -> str:
    """The enrollment listener's address by convention: the main port + 1."""
    host, _, port = listen.rpartition(":")
    return f"{host}:{int(port) + 1}"


@dataclass(frozen=True)
class DataDir:
    """Paths inside a server data directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def trust_bundle(self) -> Path:
        """CA certificates accepted from clients (the platform CA, plus any being rotated in)."""
        return self.root / "trust.pem"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    @property
    def database(self) -> Path:
        return self.root / "state.db"

    @property
    def master_key(self) -> Path:
        return self.root / "master.key"

    @property
    def keyring(self) -> Path:
        return self.root / "keyring.sealed"

    def open_keyring(self) -> LocalKeyring:
        """The tenant keyring, under $CANTATA_MASTER_KEY if set, else ``master.key``."""
        master = MasterKey.from_env() if os.environ.get(MASTER_KEY_ENV) else MasterKey.from_file(self.master_key)
        return LocalKeyring(self.keyring, master)

    @property
    def audit(self) -> Path:
        return self.root / "audit"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def exists(self) -> bool:
        return self.config.exists()

    def load_settings(self) -> ServerSettings:
        if not self.config.exists():
            raise FileNotFoundError(f"{self.root} is not a Cantata data directory (run `cantata server init`)")
        saved = json.loads(self.config.read_text())
        return ServerSettings(**{k: v for k, v in saved.items() if k not in RETIRED_SETTINGS})

    def save_settings(self, settings: ServerSettings) -> None:
        self.config.write_text(json.dumps(asdict(settings), indent=2) + "\n")

    def allowed_roots(self, settings: ServerSettings) -> list[Path]:
        """Where ``file://`` checkpoint stores and datasets may live."""
        return [self.checkpoints.resolve(), *(Path(r).resolve() for r in settings.allowed_roots)]


def write_private(path: Path, data: bytes) -> None:
    """Write a secret file readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
