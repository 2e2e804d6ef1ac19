"""The server's data directory: its layout and its ``server.json`` settings.

D/server.json        settings written by ``cantata server init``
D/ca.pem, D/ca.key   the platform CA (key mode 0600)
D/trust.pem          CA certificates accepted from clients (reloaded on change)
D/server.pem/.key    the server's TLS certificate
D/state.db           SQLite control-plane state
D/master.key         master key of the tenant keyring (0600), unless $CANTATA_MASTER_KEY is set
D/keyring.sealed     tenants' key-encryption keys, encrypted under the master key
D/audit/             tamper-evident audit log and its signing keys
D/ray/token          the Ray cluster's token (``server init --ray-token``), 0600
D/exits/             how workers exited, written by the zygote that forked them (read after a restart)
D/jobs/<job-id>/     per-job workspaces (worker configs, certificates, logs), 0700, the job's uid's while it runs
D/uids/<uid>.json    the worker uids in use (or retired), with the folders each may have written
D/tenant-gids.json   each tenant's gid (as root: its workers' group, its file:// folders')
D/checkpoints/       the default local checkpoint store (<tenant>/<job>/...)

At start the server makes ``D``, ``D/jobs`` and ``D/checkpoints`` passable but
not listable (0711), certificates 0644, every other file 0600 and every other
directory 0700 (:func:`cantata.server.workers.sandbox.lock_data_dir`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cantata.security.keys import MASTER_KEY_ENV, LocalKeyring, MasterKey
from cantata.security.worker_confinement import DEFAULT_TASK_ALLOWANCE
from cantata.server.dashboard.signin import SignInLimits
from cantata.server.enrollment import EnrollmentLimits
from cantata.server.jobs.admission import ConnectionLimits
from cantata.server.workers.local_roots import LocalRoots

CONFIG_NAME = "server.json"
RETIRED_SETTINGS = frozenset({"max_job_attempts"})  # read from older server.json files and ignored


@dataclass
class ServerSettings:
    """What ``server init`` records and ``server start`` uses."""

    listen: str = "127.0.0.1:7443"  # mutual TLS: every service
    enroll_listen: str = ""  # server-authenticated TLS: enrollment only; default port + 1
    metrics_listen: str = ""  # HTTPS GET /metrics for scraper certificates only (docs/operations.md); "": off
    scraper_cert_days: int = 365  # lifetime of a certificate `cantata admin scrapers add` issues
    advertise: list[str] = field(default_factory=list)  # names and IPs clients and nodes use: server cert SANs
    max_workers_on_node: int = 8  # worker processes this node runs at once
    default_quota: dict = field(
        default_factory=lambda: {"max_concurrent_jobs": 4, "max_workers_per_job": 8, "max_total_steps": 100_000}
    )
    allowed_roots: list[str] = field(default_factory=list)  # shared file:// roots: each tenant gets <root>/<tenant>/
    tenant_roots: dict[str, list[str]] = field(default_factory=dict)  # file:// roots granted to one tenant
    cancel_grace_seconds: float = 5.0
    on_stop: str = "leave"  # SIGTERM/SIGINT: "leave" running jobs to the next server, or "requeue" (stop) them
    worker_cert_hours: float = 72.0
    tenant_cert_days: int = 30
    revoke_quarantined_workers: bool = False  # policy when a worker is quarantined for gradient anomalies
    straggler_factor: float = 2.0  # a worker slower than this x the median of its peers' step times ...
    straggler_reports: int = 3  # ... for this many progress reports in a row is reported as a straggler
    max_worker_restarts: int = 10  # upper bound on every job's max_failures (decentralized: restarts per worker)
    restart_backoff_seconds: float = 1.0  # wait before a job's first restart after a failure; doubles each time
    restart_backoff_max_seconds: float = 30.0  # the longest wait between restarts
    orphan_upload_seconds: float = 3600.0  # unfinished uploads older than this in a checkpoint store are removed
    orphan_sweep_seconds: float = 600.0  # how often the checkpoint stores are swept for them
    retention_sweep_seconds: float = 3600.0  # how often ended jobs past their tenant's retention are deleted
    worker_heartbeat_timeout_s: float = 60.0  # a worker silent this long is hung: it is killed
    max_streams_per_principal: int = 256  # open streams (watches, log follows, downloads) one caller may hold
    # Anonymous enrollment (see cantata.server.enrollment and docs/security.md#enrollment-limits):
    enroll_max_pending: int = 100  # tenancy requests pending at once, in all
    enroll_max_pending_per_address: int = 3  # ... and from one source address (IPv6: one /64)
    enroll_rate_per_minute: float = 10.0  # enrollment calls per source address, refilled continuously
    enroll_burst: int = 10  # ... of which this many may come at once
    enroll_pending_ttl_hours: float = 72.0  # a request still pending after this is deleted; its name is free
    anonymous_refusal_window_s: float = 60.0  # anonymous refusals are counted per address and reason in this window
    warm_workers: bool = True  # fork workers from a zygote that already imported torch (false: each imports it)
    worker_uid_base: int = 61000  # as root, each running job's workers get a uid of their own from here up
    worker_uid_count: int = 1000
    worker_seccomp: bool = True  # the workers' syscall filter (needs libseccomp); false: run them without it
    worker_task_allowance: int = (
        DEFAULT_TASK_ALLOWANCE  # RLIMIT_NPROC: tasks per worker process beyond its compute threads (0: none)
    )
    tenant_gid_base: int = 63000  # as root, each tenant's gid (its workers' group, its file:// folders') from here up
    tenant_gid_count: int = 1000
    node_memory_mib: int = 0  # memory for workers on this node (0: the machine's); running jobs reserve their estimate
    worker_memory_mib: int = 0  # a worker's memory limit past its loaded size (0: twice its estimate + 1 GiB)
    gpus: int = -1  # GPUs of this node for the local executor (-1: torch.cuda.device_count() in a subprocess)
    executor: str = "local"  # where workers run: "local" (children of this server) or "ray" (a Ray cluster)
    ray_address: str = ""  # the Ray cluster's GCS, HOST:PORT (executor "ray")
    shared_roots: list[str] = field(
        default_factory=list
    )  # file:// roots every node mounts: multi-node jobs may use them
    dashboard_listen: str = ""  # HOST:PORT of the read-only web dashboard (HTTPS); empty: no dashboard
    dashboard_url: str = ""  # its address in login links (default: https:// and the dashboard_listen address)
    dashboard_link_seconds: float = 60.0  # a login link works once, for this long
    dashboard_session_hours: float = 8.0  # a browser's session lasts this long (a restart also ends it)
    # Per principal (docs/security.md#dashboard-limits): nothing one principal does evicts another's link or session
    dashboard_links_per_principal: int = 10  # unused, unexpired login links one principal holds at once
    dashboard_links_per_minute: float = 6.0  # login links one principal is issued, refilled continuously ...
    dashboard_link_burst: int = 10  # ... of which this many at once
    dashboard_sessions_per_principal: int = 16  # live dashboard sessions; one more ends that principal's oldest
    # Connections, on every listening port (docs/security.md#floods):
    max_connections: int = 1024  # open TCP connections on each gRPC port (main, enrollment), all sources together
    max_connections_per_address: int = 64  # ... from one source address (IPv6: one /64), on each port
    http_max_connections: int = 256  # open TCP connections on the dashboard's port, and on /metrics's, each
    handshake_timeout_s: float = 10.0  # TLS handshake, and an HTTP request's head, must be done by then or closed
    idle_connection_s: float = 600.0  # a gRPC connection with no call for this long is closed (clients reconnect)
    reserved_fds: int = 1024  # open files kept for the server itself (database, audit log, workers, outgoing calls)
    # Webhooks (docs/monitoring.md#webhooks):
    webhook_max_endpoints: int = 10  # endpoints one tenant may register
    webhook_max_pending: int = 1000  # deliveries one endpoint may have waiting; more are recorded dead
    webhook_allowed_networks: list[str] = field(default_factory=list)  # CIDRs webhooks may reach though not public
    webhook_ca_file: str = ""  # CA bundle receivers' certificates are checked against (default: the system's)
    webhook_timeout_s: float = 10.0  # one delivery attempt: connect, TLS, request and answer
    webhook_max_attempts: int = 8  # attempts of a delivery before it is dead
    webhook_backoff_s: float = 5.0  # wait before the first retry; doubles each time, half of it random
    webhook_backoff_max_s: float = 3600.0  # the longest wait between attempts


def enrollment_limits(settings: ServerSettings) -> EnrollmentLimits:
    return EnrollmentLimits(
        max_pending=settings.enroll_max_pending,
        max_pending_per_address=settings.enroll_max_pending_per_address,
        rate_per_minute=settings.enroll_rate_per_minute,
        burst=settings.enroll_burst,
        pending_ttl_hours=settings.enroll_pending_ttl_hours,
        refusal_window_s=settings.anonymous_refusal_window_s,
    )


def connection_limits(settings: ServerSettings, *, http: bool) -> ConnectionLimits:
    """The bounds of a gRPC port, or (``http``) of the dashboard's or /metrics's."""
    return ConnectionLimits(
        per_address=min(settings.max_connections_per_address, settings.http_max_connections if http else 1 << 30),
        total=settings.http_max_connections if http else settings.max_connections,
        handshake_timeout_s=settings.handshake_timeout_s,
    )


def signin_limits(settings: ServerSettings) -> SignInLimits:
    return SignInLimits(
        links_per_principal=settings.dashboard_links_per_principal,
        links_per_minute=settings.dashboard_links_per_minute,
        link_burst=settings.dashboard_link_burst,
        sessions_per_principal=settings.dashboard_sessions_per_principal,
    )


def enrollment_address(listen: str) -> str:
    """The enrollment listener's address by convention: the main port + 1."""
    host, _, port = listen.rpartition(":")
    return f"{host}:{int(port) + 1}"


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 (names them, binds nothing)


class PortCollision(ValueError):
    """Two of the server's listeners are set to the same port of one host."""


def check_ports(listeners: dict[str, str]) -> None:
    """Refuse two listeners (name -> ``HOST:PORT``; empty: off) on one port where their hosts overlap (a wildcard
    host overlaps every host); port 0 (any free port) never collides."""
    taken: list[tuple[str, str, int]] = []
    for name, address in listeners.items():
        if not address:
            continue
        host, _, port = address.rpartition(":")
        host, number = host.strip("[]"), int(port)
        for other, other_host, other_number in taken:
            overlap = host == other_host or host in WILDCARD_HOSTS or other_host in WILDCARD_HOSTS
            if number and number == other_number and overlap:
                raise PortCollision(
                    f"{name} {address} and {other} {listeners[other]} use the same port {number}: "
                    f"give {name} a port of its own"
                )
        taken.append((name, host, number))


def settings_ports(settings: ServerSettings, listen: str | None = None) -> dict[str, str]:
    """The listeners ``settings`` serve on (``listen`` overriding the main one)."""
    return {
        "listen": listen or settings.listen,
        "enroll_listen": settings.enroll_listen,
        "dashboard_listen": settings.dashboard_listen,
        "metrics_listen": settings.metrics_listen,
    }


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
    def sweeps(self) -> Path:
        """Optuna's storage of the sweeps' studies (:mod:`cantata.server.sweeps`)."""
        return self.root / "sweeps.db"

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
    def ray_token(self) -> Path:
        return self.root / "ray" / "token"

    @property
    def audit(self) -> Path:
        return self.root / "audit"

    @property
    def uid_leases(self) -> Path:
        return self.root / "uids"

    @property
    def tenant_gids(self) -> Path:
        return self.root / "tenant-gids.json"

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

    def local_roots(self, settings: ServerSettings) -> LocalRoots:
        """Where each tenant's ``file://`` checkpoint stores and datasets may live."""
        return LocalRoots(
            data_dir=self.root.resolve(),
            default_store=self.checkpoints.resolve(),
            shared=tuple(Path(r).resolve() for r in settings.allowed_roots),
            granted={t: tuple(Path(r).resolve() for r in roots) for t, roots in settings.tenant_roots.items()},
        )


def write_private(path: Path, data: bytes) -> None:
    """Write a secret file readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
