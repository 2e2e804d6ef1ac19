"""A worker's launch plan: what either executor starts one worker process with, made in one place.

The executor says where the worker's files go on its node (:class:`WorkerFiles`),
the address of the server it reports to, its rendezvous, threads, devices
and uid; :func:`plan_worker` mints its certificate (recorded in the
certificate registry), builds its :class:`~cantata.proto.launch.WorkerLaunch`
with the job's secrets, and the :class:`SpawnRequest` its node's zygote forks
it by. The executor writes the files (the launch 0600, owned by the worker's
uid) where the plan says, and starts it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cantata.proto.launch import WorkerLaunch, WorkerSecrets
from cantata.security.pki import Bundle, CertificateAuthority, Principal, gossip_server_name
from cantata.security.process_sandbox import SpawnRequest
from cantata.security.worker_confinement import ConfinementPolicy
from cantata.server.jobs.groups import processes
from cantata.server.network.ports import CertificateRegistry
from cantata.server.store import JobRecord
from cantata.server.workers.sandbox import Identity, base_environment, store_environment

ENTRY = "cantata.trainer.worker:main"


@dataclass(frozen=True)
class WorkerFiles:
    """Where a worker's files are on its node: its working folder, certificates, launch and log."""

    folder: Path  # its HOME and working directory; TMPDIR is tmp/ in it
    ca: Path
    cert: Path
    key: Path
    launch: Path
    log: Path

    @classmethod
    def in_workspace(cls, workspace: Path, worker: int) -> WorkerFiles:
        """The files of process ``worker`` in its job's workspace, beside the job's other processes' (local)."""
        return cls(
            workspace,
            workspace / "ca.pem",
            workspace / f"worker-{worker}.pem",
            workspace / f"worker-{worker}.key",
            workspace / f"worker-{worker}.json",
            workspace / f"worker-{worker}.log",
        )

    @classmethod
    def in_folder(cls, folder: Path) -> WorkerFiles:
        """The files of a worker with a folder of its own (on a Ray node)."""
        return cls(
            folder,
            folder / "ca.pem",
            folder / "worker.pem",
            folder / "worker.key",
            folder / "worker.json",
            folder / "worker.log",
        )


@dataclass(frozen=True)
class LaunchSettings:
    """What an executor starts every worker with: the CA that certifies it, and its sandbox's limits."""

    ca: CertificateAuthority
    certificates: CertificateRegistry
    cert_lifetime: dt.timedelta
    memory_limit: Callable[[JobRecord], int]  # bytes a worker of the job may allocate once loaded (0: no limit)
    confinement: ConfinementPolicy


@dataclass(frozen=True)
class WorkerPlan:
    """One worker process's start: its launch (secrets included), its certificate, and how its zygote forks it."""

    launch: WorkerLaunch
    certificate: Bundle = field(repr=False)
    request: SpawnRequest = field(repr=False)


def plan_worker(
    settings: LaunchSettings,
    job: JobRecord,
    worker: int,
    *,
    files: WorkerFiles,
    server: str,
    rendezvous: str,
    threads: int,
    secrets: WorkerSecrets,
    identity: Identity | None,
    attack: dict | None = None,
    fault: dict | None = None,
    devices: Sequence[int | str] = (),
    node_ip: str | None = None,
    status: str = "",
) -> WorkerPlan:
    """Plan process ``worker`` of ``job``: mint and record its certificate, and build its launch and spawn request.

    ``node_ip``: the cluster address of its node, where its gossip endpoint binds (named in its certificate);
    None: this machine's loopback. ``status``: where its zygote writes its exit status ("": the node decides).
    """
    principal = Principal.worker(job.id, worker)
    bundle = settings.ca.issue_bundle(
        principal,
        lifetime=settings.cert_lifetime,
        server=True,
        dns_names=[gossip_server_name(job.id, worker)],
        ips=[node_ip] if node_ip else [],
    )
    settings.certificates.record_certificate(
        bundle.certificate.serial_number, principal.uri, bundle.certificate.not_valid_after_utc
    )
    launch = WorkerLaunch(
        job_id=job.id,
        tenant=job.tenant,
        worker=worker,
        workers=job.spec.workers,
        attempt=job.attempts,
        server=server,
        ca=str(files.ca),
        cert=str(files.cert),
        key=str(files.key),
        rendezvous=rendezvous,
        threads=threads,
        spec=job.spec,
        secrets=secrets,
        attack=attack,
        fault=fault,
        store_env=store_environment(job.spec.checkpoint_store),
        **({"gossip_host": node_ip} if node_ip else {}),
    )
    argv = ["--config", str(files.launch), "--job", job.id]
    env = {**base_environment(), "OMP_NUM_THREADS": str(threads), "HOME": str(files.folder)}
    env["TMPDIR"] = str(files.folder / "tmp")
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    request = SpawnRequest(
        argv=argv,
        entry=ENTRY,
        title=" ".join(["python", "-m", ENTRY.partition(":")[0], *argv]),
        env=env,
        cwd=str(files.folder),
        log=str(files.log),
        uid=identity.uid if identity else None,
        gid=identity.gid if identity else None,
        memory_bytes=settings.memory_limit(job),
        status=status,
        **settings.confinement.request_fields(processes(job.spec), threads),
        groups=list(identity.groups) if identity else [],
    )
    return WorkerPlan(launch, bundle, request)
