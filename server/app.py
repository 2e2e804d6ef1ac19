"""The control-plane server: assembles its parts in one place and serves them over gRPC with TLS.

Reading :meth:`ControlPlane.start` top-down shows the whole wiring: the one
database and the stores on it, the audit log, the secrets broker, the
launcher, the job lifecycle, the scheduler, the gatekeeper and the services,
each given its collaborators (:mod:`cantata.server.network.ports`) in its constructor.

gRPC is served by its asyncio server (:mod:`cantata.server.network.serving`): streams
(event watches, log follows, downloads, health watches) wait on its event
loop, so an idle one holds no thread; unary calls run in a pool of
``RPC_THREADS`` threads, as does every blocking step of a stream, except
``GetJob`` and ``SubmitJob``, which run on the loop (a submit's write is the
submit writer's, :mod:`cantata.server.jobs.submissions`).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cantata.proto.v1 import (
    admin_pb2_grpc,
    audit_pb2_grpc,
    checkpoints_pb2_grpc,
    dashboard_pb2_grpc,
    datasources_pb2_grpc,
    jobs_pb2,
    jobs_pb2_grpc,
    sweeps_pb2_grpc,
    tenancy_pb2_grpc,
    webhooks_pb2_grpc,
    worker_pb2_grpc,
)
from cantata.security import seccomp_policy
from cantata.security.audit import Action, AuditLog, AuditLogUnavailable
from cantata.security.pki import CertificateAuthority, Principal
from cantata.security.worker_confinement import ConfinementPolicy
from cantata.server.auth import AuthInterceptor, Gatekeeper, request_id
from cantata.server.broadcast import EventBroadcast
from cantata.server.config import (
    DataDir,
    ServerSettings,
    check_ports,
    connection_limits,
    enrollment_limits,
    settings_ports,
    signin_limits,
)
from cantata.server.dashboard.signin import Session, SignIn
from cantata.server.dashboard.sweeps import SweepViews
from cantata.server.database import Database
from cantata.server.datasource_store import DataSourceStore
from cantata.server.enrollment import RefusalDigest
from cantata.server.errors import ErrorInterceptor
from cantata.server.executors import Executor
from cantata.server.executors.registry import ExecutorSetup, executor_kind
from cantata.server.jobs.deletion import JobDeletion, RetentionSweeper
from cantata.server.jobs.lifecycle import JobLifecycle
from cantata.server.jobs.memory import node_capacity, runtime_budget
from cantata.server.jobs.restarts import RestartPolicy
from cantata.server.jobs.scheduler import Scheduler
from cantata.server.jobs.stragglers import StragglerDetector
from cantata.server.jobs.submissions import SubmitWriter
from cantata.server.jobs.voided_submissions import submitted_jobs, to_void
from cantata.server.network.connection_reaper import ConnectionReaper
from cantata.server.network.fd_budget import reserve_descriptors
from cantata.server.network.health import HealthService
from cantata.server.network.metrics_endpoint import MetricsEndpoint
from cantata.server.network.serving import ServingLoop
from cantata.server.network.streams import StreamCounter
from cantata.server.network.tls import RotatingCredentials
from cantata.server.request_audit import RequestAudit
from cantata.server.services.admin import AdminService
from cantata.server.services.audit import AuditService
from cantata.server.services.checkpoints import CheckpointsService
from cantata.server.services.dashboard import DashboardService
from cantata.server.services.datasources import DataSourcesService
from cantata.server.services.jobs import JobsService, submitted_digest
from cantata.server.services.sweeps import SweepsService, check_job
from cantata.server.services.tenancy import TenancyService
from cantata.server.services.webhooks import WebhooksService
from cantata.server.services.worker import WorkerService
from cantata.server.store import Store
from cantata.server.sweeper import OrphanSweeper
from cantata.server.sweeps.runner import SweepRunner, optuna_storage, submit_from_thread
from cantata.server.sweeps.store import SweepStore
from cantata.server.telemetry import Telemetry
from cantata.server.webhooks.delivery import WebhookDeliverer
from cantata.server.webhooks.store import WebhookStore
from cantata.server.webhooks.targets import AddressPolicy
from cantata.server.workers import id_ranges
from cantata.server.workers.heartbeats import Heartbeats
from cantata.server.workers.local_roots import LocalRoots
from cantata.server.workers.sandbox import Identities, Lease, check_passable, lock_data_dir
from cantata.server.workers.secrets_broker import SecretsBroker
from cantata.server.workers.tenant_groups import TenantGroups

if TYPE_CHECKING:
    from cantata.server.dashboard.serving import DashboardServer

MAX_MESSAGE_BYTES = 4 << 20
RPC_THREADS = 32  # unary calls and the blocking steps of streams run in this many threads
ON_STOP = ("leave", "requeue")  # what a stopping server does with running jobs

log = logging.getLogger(__name__)


class ControlPlane:
    """One server process: ``start()``, then ``stop()`` (also on SIGTERM/SIGINT)."""

    def __init__(
        self,
        data_dir: Path,
        listen: str | None = None,
        executor: str | None = None,
        ray_address: str | None = None,
        gpus: int | None = None,
        on_stop: str | None = None,
    ):
        self.paths = DataDir(Path(data_dir))
        self.settings: ServerSettings = self.paths.load_settings()
        self.on_stop = on_stop or self.settings.on_stop
        if self.on_stop not in ON_STOP:
            raise ValueError(f"on_stop must be one of {', '.join(ON_STOP)}, not {self.on_stop!r}")
        self.listen = listen or self.settings.listen
        check_ports(settings_ports(self.settings, self.listen))
        self.executor = executor or self.settings.executor
        self.ray_address = ray_address or self.settings.ray_address
        self.gpus = self.settings.gpus if gpus is None else gpus
        self.executor_kind = executor_kind(self.executor, self.ray_address)
        self.ca = CertificateAuthority.load(self.paths.ca_cert.read_bytes(), self.paths.ca_key.read_bytes())
        self.database = Database(self.paths.database)
        self.broadcast = EventBroadcast()
        self.store = Store(self.database, self.broadcast)
        self.metrics = self.store.metrics
        self.telemetry = Telemetry()
        self.keyring = self.paths.open_keyring()
        self.data_sources = DataSourceStore(self.database, self.keyring)
        self.webhooks = WebhookStore(
            self.database,
            self.keyring,
            max_endpoints=self.settings.webhook_max_endpoints,
            max_pending=self.settings.webhook_max_pending,
        )
        self.store.on_event = self.webhooks.enqueue
        self.webhook_policy = AddressPolicy(self.settings.webhook_allowed_networks)
        self.deliverer = WebhookDeliverer(
            self.webhooks,
            self.webhook_policy,
            ca_file=self.settings.webhook_ca_file,
            timeout_s=self.settings.webhook_timeout_s,
            max_attempts=self.settings.webhook_max_attempts,
            backoff_s=self.settings.webhook_backoff_s,
            backoff_max_s=self.settings.webhook_backoff_max_s,
        )
        self.audit = AuditLog.open(self.paths.audit)
        # A submit's job and record are synced side by side: a crash between the two syncs may have kept jobs
        # whose records it took. They were never acknowledged nor placed; undone before anything reads them.
        for job_id in self.store.undo_unrecorded(self.audit.signed_at_open, self.audit.unsigned_at_open):
            log.warning(
                "undid the submission of %s: the crash took its audit record, and it was not acknowledged", job_id
            )
        # And the opposite: a crash after a record's sync but before its commit's leaves a job_submitted record for
        # a job that never existed. The log is append-only: each gets one compensating record, before anything else.
        unsigned = self.audit.unsigned_at_open
        for seq, record in to_void(unsigned, self.store.existing_jobs(submitted_jobs(unsigned))):
            self.audit.append(
                "server",
                Action.JOB_SUBMISSION_VOIDED,
                resource=record.resource,
                tenant=record.tenant,
                details={"submitted_seq": seq, "reason": "the crash took the job before its commit was durable"},
            )
            log.warning("voided the job_submitted record %d of %s: the job was never committed", seq, record.resource)
        # What the parts write through: records name the call; a submit's record is synced beside its commit.
        self.recorder = RequestAudit(self.audit, request_id, self.database, self.telemetry.audited)
        self.enrollment_limits = enrollment_limits(self.settings)
        self.refusals = RefusalDigest(
            self.recorder.append, self.enrollment_limits.refusal_window_s
        )  # anonymous: counted
        self.port: int | None = None
        self.metrics_port: int | None = None  # where /metrics is served, when metrics_listen is set
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._stopping = threading.Event()
        self._registered = False  # this server's worker uids and tenant gids are in the host's registry
        self._stopped = threading.Event()
        self._server: grpc.aio.Server | None = None
        self._guards: list[AuthInterceptor] = []  # one per gRPC server (the port and the enrollment port)
        self.streams = StreamCounter(self.settings.max_streams_per_principal)
        self._serving = ServingLoop(RPC_THREADS, "rpc")
        self.signin = (
            SignIn(
                self.settings.dashboard_link_seconds,
                self.settings.dashboard_session_hours * 3600,
                signin_limits(self.settings),
            )
            if self.settings.dashboard_listen
            else None
        )
        self._dashboard: DashboardServer | None = None
        self.dashboard_port: int | None = None
        self.grpc_limits = connection_limits(self.settings, http=False)
        self.http_limits = connection_limits(self.settings, http=True)
        self._reaper: ConnectionReaper | None = None

    def _grpc_server(self, gatekeeper: Gatekeeper) -> grpc.aio.Server:
        guard = AuthInterceptor(
            gatekeeper,
            self.refusals.append,
            self.streams,
            observe=self.telemetry.rpc,
            refused=self.telemetry.refusal,
        )
        self._guards.append(guard)
        return self._serving.server(
            interceptors=[
                guard,
                ErrorInterceptor(request_id),
            ],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # Floods (docs/security.md#floods); per source address: the connection reaper.
                ("grpc.max_allowed_incoming_connections", self.grpc_limits.total),
                ("grpc.server_handshake_timeout_ms", round(self.grpc_limits.handshake_timeout_s * 1000)),
                ("grpc.max_connection_idle_ms", round(self.settings.idle_connection_s * 1000)),
            ],
        )

    def _identities(self, roots: LocalRoots) -> Identities:
        """The workers' uids (one per job, taken back when it ends) and their tenants' gids."""
        settings = self.settings
        groups = TenantGroups(
            self.paths.tenant_gids,
            settings.tenant_gid_base,
            settings.tenant_gid_count,
            folders=roots.own_folders,
        )
        return Identities(
            settings.worker_uid_base,
            settings.worker_uid_count,
            leases=self.paths.uid_leases,
            tenant_groups=groups,
            on_retired=self._uid_retired,
        )

    def _uid_retired(self, lease: Lease) -> None:
        self.recorder.append(
            "server",
            Action.WORKER_UID_RETIRED,
            resource=lease.job_id,
            details={"uid": lease.uid, "reason": lease.retired},
        )

    def _claim_ids(self) -> None:
        """As root: refuse a data directory the workers' uids cannot reach, or ids another server on this host uses."""
        if os.geteuid() != 0:
            return
        check_passable(self.paths.root)
        settings = self.settings
        uids = range(settings.worker_uid_base, settings.worker_uid_base + settings.worker_uid_count)
        gids = range(settings.tenant_gid_base, settings.tenant_gid_base + settings.tenant_gid_count)
        if id_ranges.overlap(uids, gids):
            raise ValueError(
                f"worker uids {uids.start}..{uids.stop - 1} overlap tenant gids {gids.start}..{gids.stop - 1} "
                "(a worker's gid is its uid): change worker_uid_base or tenant_gid_base in server.json"
            )
        id_ranges.register(self.paths.root.resolve(), uids, gids)
        self._registered = True

    def _executor(self, secrets: SecretsBroker, connect_host: str, port: int, roots: LocalRoots) -> Executor:
        """The executor ``server.json`` (or ``server start``) names: where and how workers start."""
        identities = self._identities(roots)
        confinement = ConfinementPolicy(self.settings.worker_seccomp, self.settings.worker_task_allowance)
        if confinement.seccomp:
            seccomp_policy.library()  # refuse to start, saying why, rather than fail every worker
        return self.executor_kind.build(
            ExecutorSetup(
                settings=self.settings,
                jobs_dir=self.paths.jobs,
                ca=self.ca,
                listen=self.listen,
                connect_host=connect_host,
                port=port,
                cluster_address=self.ray_address,
                gpus=self.gpus,
                secrets=secrets,
                certificates=self.store,
                identities=identities,
                memory_limit=lambda job: runtime_budget(job.spec, self.settings.worker_memory_mib),
                confinement=confinement,
                note=self._note,
            )
        )

    def _note(self, job_id: str, message: str) -> None:
        self.store.append_event(job_id, jobs_pb2.JobEvent(kind=jobs_pb2.MESSAGE, message=message))

    def start(self) -> int:
        """Bind, start the scheduler and serve; returns the bound port."""
        self._claim_ids()
        listeners = 2 * self.grpc_limits.total
        listeners += self.http_limits.total * (
            bool(self.settings.dashboard_listen) + bool(self.settings.metrics_listen)
        )
        open_files = reserve_descriptors(listeners, self.settings.reserved_fds)
        log.info("open files: %d allowed, %d of them for connections", open_files, listeners)
        self._serving.start()
        self.broadcast.bind(self._serving.loop)
        gatekeeper = Gatekeeper(certificates=self.store, tenants=self.store, jobs=self.store)
        server = self._grpc_server(gatekeeper)
        files = (self.paths.server_cert, self.paths.server_key, self.paths.trust_bundle)
        self.port = server.add_secure_port(
            self.listen, RotatingCredentials(*files, require_client_auth=True).credentials()
        )
        if not self.port:
            raise OSError(f"cannot listen on {self.listen}")
        # gRPC Python cannot ask for an optional client certificate, so enrollment
        # (the only call made before a tenant has one) gets its own listener.
        enrollment = self._grpc_server(gatekeeper)
        enrollment_port = enrollment.add_secure_port(
            self.settings.enroll_listen, RotatingCredentials(*files, require_client_auth=False).credentials()
        )
        if not enrollment_port:
            raise OSError(f"cannot listen on {self.settings.enroll_listen}")
        self._reaper = ConnectionReaper((self.port, enrollment_port), self.grpc_limits.per_address)
        host = self.listen.rpartition(":")[0]
        connect_host = "127.0.0.1" if host in ("0.0.0.0", "", "[::]") else host  # noqa: S104 (maps a wildcard to loopback)

        roots = self.paths.local_roots(self.settings)
        lock_data_dir(self.paths.root, passable=(self.paths.jobs, self.paths.checkpoints))
        secrets = SecretsBroker(self.keyring, self.data_sources, self.recorder, dataset_roots=roots.datasets)
        launcher = self._executor(secrets, connect_host, self.port, roots)
        launcher.start()
        lifecycle = JobLifecycle(
            self.store,
            self.recorder,
            launcher,
            restarts=RestartPolicy(
                self.settings.max_worker_restarts,
                self.settings.restart_backoff_seconds,
                self.settings.restart_backoff_max_seconds,
            ),
        )
        self.shown = lifecycle.shown  # a job as tenants see it, for the dashboard
        heartbeats = Heartbeats(self.settings.worker_heartbeat_timeout_s)
        self.scheduler = Scheduler(
            self.store,
            launcher,
            lifecycle,
            heartbeats,
            audit_failure=self.recorder.probe,
        )
        self.store.on_queue_change = self.scheduler.wake
        self.scheduler.on_placed = self.telemetry.placed
        self.stragglers = StragglerDetector(self.settings.straggler_factor, self.settings.straggler_reports)
        self.telemetry.watch(self.store, self.metrics, heartbeats.alive, self.stragglers)
        default_store = self.paths.checkpoints.resolve().as_uri()
        self.sweeper = OrphanSweeper(
            self.store,
            default_store,
            older_than=self.settings.orphan_upload_seconds,
            interval=self.settings.orphan_sweep_seconds,
        )
        node_memory = node_capacity(self.settings.node_memory_mib)
        shared_roots = [Path(r).resolve() for r in self.settings.shared_roots] if self.executor_kind.remote else None

        def spec_defaults(tenant: str) -> dict:
            return {
                "default_store": default_store,
                "roots": roots.datasets(tenant),
                "store_roots": roots.stores(tenant),
                "data_dir": roots.data_dir,
                "node_memory": node_memory,
                "shared_roots": shared_roots,
                "own_folders": roots.own_folders(tenant),
            }

        self.submissions = SubmitWriter(self.store, self.recorder)
        self.submissions.start()
        deletion = JobDeletion(self.store, self.recorder, launcher.workspace, launcher.is_running)
        self.retention = RetentionSweeper(self.store, deletion, interval=self.settings.retention_sweep_seconds)
        tenancy = TenancyService(
            self.store,
            self.ca,
            self.settings.tenant_cert_days,
            self.recorder,
            limits=self.enrollment_limits,
            refusals=self.refusals,
        )
        tenancy_pb2_grpc.add_TenancyServicer_to_server(tenancy, server)
        tenancy_pb2_grpc.add_TenancyServicer_to_server(tenancy, enrollment)
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminService(
                self.store,
                self.ca,
                self.keyring,
                self.data_sources,
                self.webhooks,
                self.settings.default_quota,
                self.settings.tenant_cert_days,
                self.recorder,
                lifecycle,
                scraper_cert_days=self.settings.scraper_cert_days,
                metrics_listen=self.settings.metrics_listen,
                sign_out=self._sign_out,
            ),
            server,
        )
        jobs_pb2_grpc.add_JobsServicer_to_server(
            JobsService(
                self.store,
                lifecycle,
                launcher.log_path,
                spec_defaults,
                self.recorder,
                self.data_sources,
                self.broadcast,
                deletion,
                self.metrics,
                self.submissions,
            ),
            server,
        )
        self.sweeps = SweepStore(self.database)
        self.sweep_storage = sweep_storage = optuna_storage(self.paths.sweeps)

        def submit_trial(tenant: str, request_id: str, spec):
            """A sweep's trial submitted as its tenant's job (checked and recorded as ``SubmitJob`` does)."""
            parsed = check_job(spec, tenant, spec_defaults(tenant), self.data_sources)
            submission = self.submissions.submit(
                tenant, request_id, parsed, submitted_digest(spec), actor="server", peer="", call_id=request_id
            )
            return submit_from_thread(self._serving.loop, submission)[0]

        self.sweep_runner = SweepRunner(
            self.sweeps,
            self.store,
            self.metrics,
            sweep_storage,
            submit=submit_trial,
            cancel=lifecycle.cancel_for_tenant,
            audit=self.recorder,
        )
        sweeps_pb2_grpc.add_SweepsServicer_to_server(
            SweepsService(self.sweeps, sweep_storage, spec_defaults, self.recorder, self.data_sources), server
        )
        checkpoints_pb2_grpc.add_CheckpointsServicer_to_server(
            CheckpointsService(self.store, self.keyring, self.recorder.append), server
        )
        worker_pb2_grpc.add_WorkerServicer_to_server(
            WorkerService(
                self.store,
                lifecycle,
                self.recorder,
                heartbeats,
                self.metrics,
                self.stragglers,
                revoke_quarantined=self.settings.revoke_quarantined_workers,
                checkpoint_written=self.telemetry.checkpoint,
                store_outage=self.telemetry.store_outage,
                trained=self.telemetry.trained,
            ),
            server,
        )
        datasources_pb2_grpc.add_DataSourcesServicer_to_server(
            DataSourcesService(self.data_sources, self.recorder.append), server
        )
        webhooks_pb2_grpc.add_WebhooksServicer_to_server(
            WebhooksService(self.webhooks, self.webhook_policy, self.recorder.append), server
        )
        audit_pb2_grpc.add_AuditServicer_to_server(AuditService(self.paths.audit, self.audit.checkpoint), server)
        dashboard_url = self._start_dashboard(launcher.log_path, SweepViews(self.sweeps, sweep_storage))
        dashboard_pb2_grpc.add_DashboardServicer_to_server(
            DashboardService(self.signin, dashboard_url, self.recorder, self.refusals), server
        )
        self.health = HealthService()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, enrollment)

        self._serving.run(server.start())
        self._serving.run(enrollment.start())
        self._server, self._enrollment = server, enrollment
        self._reaper.start()
        self.scheduler.start()
        self.sweep_runner.start()
        self.sweeper.start()
        self.retention.start()
        self.deliverer.start()
        if self.settings.metrics_listen:
            self._metrics_endpoint = MetricsEndpoint(
                self.settings.metrics_listen,
                *files,
                self.telemetry.registry,
                limits=self.http_limits,
                is_revoked=self.store.is_revoked,
                audit=self.refusals.append,
                refused=self.telemetry.refusal,
            )
            self.metrics_port = self._metrics_endpoint.start()
            log.info("serving /metrics on port %d (scraper certificates only)", self.metrics_port)
        self._serving.run(self.health.set("", health_pb2.HealthCheckResponse.SERVING))
        # What start-up made lives as long as the server: kept out of the collector's passes, so that a full one
        # (which a burst of calls or a fan-out to many watchers sets off) costs what serving allocates, not all of it.
        gc.freeze()
        log.info("serving on port %d (enrollment on %s)", self.port, self.settings.enroll_listen)
        self.audit.append(
            "server",
            Action.SERVER_STARTED,
            details={
                "listen": self.listen,
                "port": self.port,
                "enroll_listen": self.settings.enroll_listen,
                "metrics_listen": self.settings.metrics_listen,
            },
        )
        return self.port

    def _start_dashboard(self, log_path: Callable[[str, int], Path], sweeps: SweepViews) -> str:
        """Serve the web dashboard if ``dashboard_listen`` is set; returns its base URL ("" when there is none)."""
        if self.signin is None:
            return ""
        from cantata.server.dashboard.app import Dashboard
        from cantata.server.dashboard.series import EventSeries
        from cantata.server.dashboard.serving import DashboardServer, public_url
        from cantata.server.dashboard.views import Views

        def allowed(session: Session) -> bool:
            """A session lasts while its certificate is not revoked and its tenant is approved."""
            who = session.principal
            return not self.store.is_revoked(session.serial) and (
                who.role != "tenant" or self.store.tenant_status(who.name) == "APPROVED"
            )

        dashboard = Dashboard(
            self.signin,
            Views(self.store, self.paths.audit, self.audit.checkpoint, self.metrics, log_path, self.shown),
            EventSeries(self.store, self.broadcast),
            self.refusals.append,  # the recorder, counting anonymous refusals (unknown login links) per address
            allowed,
            self.streams,
            sweeps,
        )
        server = DashboardServer(
            dashboard.app,
            self.settings.dashboard_listen,
            self.paths.server_cert,
            self.paths.server_key,
            self.http_limits,
        )
        self.dashboard_port = server.start(self._serving.loop)
        self._dashboard = server
        log.info("dashboard on port %d", self.dashboard_port)
        return public_url(self.settings.dashboard_listen, self.dashboard_port, self.settings.dashboard_url)

    def _sign_out(self, tenant: str) -> None:
        """End a (suspended) tenant's dashboard sessions and void its login links."""
        if self.signin is not None:
            ended = self.signin.sign_out(Principal.tenant(tenant))
            log.info("signed %s out of the dashboard (%d sessions ended)", tenant, ended)

    def stop(self, grace: float = 5.0) -> None:
        """Graceful stop: refuse new calls, save state; leave running jobs to the next server (``on_stop``
        "leave": an upgrade), or stop them and requeue them to resume from their checkpoints ("requeue")."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        log.info("stopping: refusing new calls, %.0f s for those in flight", grace)
        if self._dashboard is not None:
            self._dashboard.stop()
        if self._reaper is not None:
            self._reaper.stop()
        if self._server is not None:
            self._serving.run(self.health.enter_graceful_shutdown())
            self._serving.run(self._enrollment.stop(grace))
            self._serving.run(self._server.stop(grace))
            self.sweep_runner.shutdown()  # before the submit writer closes: it submits trials
            self.submissions.close()  # no call submits any more: what it queued is written
            for guard in self._guards:
                guard.close()  # the lines of the streams that ended
            self.scheduler.shutdown(leave_jobs=self.on_stop == "leave")
            self.sweeper.shutdown()
            self.retention.shutdown()
            self.deliverer.shutdown()
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()
        self.refusals.close()  # the counts of open windows, before the log closes
        self._serving.stop()
        try:
            self.audit.append("server", Action.SERVER_STOPPED, details={"jobs": self.on_stop})
        except AuditLogUnavailable:
            log.error("stopping without a server_stopped record: the audit log cannot be written")
        self.audit.close()
        self.database.close()
        if self._registered:
            id_ranges.unregister(self.paths.root.resolve())
        log.info("stopped")
        self._stopped.set()

    def serve_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=self.stop, name="stop").start())
        self._stopped.wait()
