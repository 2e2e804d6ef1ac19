"""The one interface both executors implement, as the scheduler, the lifecycle and the services use it, and the
base they share: the launch plan, the job's folder and logs here, and the record of its workers' exits."""

from __future__ import annotations

import datetime as dt
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from cantata.proto.launch import WorkerSecrets
from cantata.security.pki import CertificateAuthority
from cantata.security.worker_confinement import ConfinementPolicy
from cantata.server.executors.plan import LaunchSettings, WorkerFiles, WorkerPlan, plan_worker
from cantata.server.jobs.groups import group_size
from cantata.server.network.ports import CertificateRegistry, SecretsBroker
from cantata.server.store import JobRecord, WorkerRecord
from cantata.server.workers.sandbox import Identities, Identity
from cantata.storage import uri as stores


@dataclass
class WorkerExit:
    """A worker process ended with ``returncode`` (negative: killed by that signal); ``node_lost``: with its node."""

    job_id: str
    worker: int
    returncode: int
    node_lost: bool = False


class NotPlaceable(Exception):
    """The job cannot start now; it stays queued with this reason.

    ``never``: not on the executor as it is (the others pass it); ``retry``: look again at the next
    tick, since room may come without a worker of ours exiting (a cluster's other users, a node joining).
    """

    def __init__(self, reason: str, *, never: bool = False, retry: bool = False):
        super().__init__(reason)
        self.never = never
        self.retry = retry


class Executor(Protocol):
    """Starts, signals and reaps the worker processes of jobs; knows nothing of job states."""

    def start(self) -> None:
        """Get ready for the first job (a warm zygote, a connection to the cluster)."""
        ...

    def placement(self, job: JobRecord) -> None:
        """Raise :class:`NotPlaceable` if ``job`` cannot start now (no free slots, GPUs or nodes)."""
        ...

    def launch(self, job: JobRecord, *, attack: dict | None = None, fault: dict | None = None) -> dict[int, int]:
        """Start every worker process of ``job``; returns process index -> pid.

        Raises :class:`NotPlaceable` (having started nothing) if the room ``placement`` saw was taken
        meanwhile: the job is queued again, not failed.
        """
        ...

    def relaunch(self, job: JobRecord, worker: int) -> int:
        """Start one exited worker again with the job's secrets as they are now; returns its pid."""
        ...

    def poll(self) -> list[WorkerExit]:
        """Exited workers since the last poll, in the order they died; force what outlived a terminate's grace."""
        ...

    def finished_jobs(self) -> list[str]:
        """Jobs whose workers have all exited; ``release`` them once settled."""
        ...

    def release(self, job_id: str) -> None:
        """Forget a job whose workers have all exited, and scrub its secrets."""
        ...

    def terminate(self, job_id: str) -> None:
        """Stop every worker of the job: now, then by force after a grace period."""
        ...

    def kill(self, job_id: str, worker: int) -> None:
        """Kill one (hung) worker now; ``poll`` reports its exit like any other."""
        ...

    def alive_workers(self, job_id: str) -> int: ...

    def running_workers(self) -> int: ...

    def is_running(self, job_id: str) -> bool: ...

    def live_workers(self) -> list[tuple[str, int, float]]:
        """(job id, process index, monotonic start time) of every worker neither exited nor killed."""
        ...

    def workspace(self, job_id: str) -> Path:
        """The job's folder on this server (its logs; deleted with the job)."""
        ...

    def log_path(self, job_id: str, worker: int) -> Path: ...

    def log_tail(self, job_id: str, worker: int) -> str: ...

    def scrub(self, job_id: str) -> None:
        """Delete the job's secret-bearing files."""
        ...

    def adopt(
        self, job: JobRecord, workers: list[WorkerRecord], *, attack: dict | None = None, fault: dict | None = None
    ) -> int | None:
        """Take over the job's workers an earlier server started; how many still run (None: this executor's
        workers do not outlive their server, so the job is requeued)."""
        ...

    def started_at(self, job_id: str, worker: int) -> int:
        """The worker process's start time (with its pid, it names the process; 0: not a local process)."""
        ...

    def kill_orphan(self, worker: WorkerRecord, job_id: str) -> None:
        """Kill a worker a crashed server left running, if it is still there."""
        ...

    def kill_strays(self) -> list[int]:
        """Kill workers no adopted job owns; their pids."""
        ...

    def detach(self) -> None:
        """Let go of every worker for the next server to adopt (a stop for an upgrade)."""
        ...

    def scrub_all(self) -> None:
        """Scrub every workspace (at start, when no worker runs)."""
        ...

    def stop_all(self) -> None:
        """Stop every job's workers and wait until they are gone."""
        ...


@dataclass(kw_only=True)
class JobRun:
    """What an executor keeps of a running job, wherever its workers run."""

    rendezvous: list[str] = field(default_factory=list)  # per torch.distributed group
    attack: dict | None = None
    fault: dict | None = None  # an admin's planned fault (cantata.proto.faults), evaluation only
    started: dict[int, float] = field(default_factory=dict)  # process index -> time.monotonic() at its start
    exited: dict[int, int] = field(default_factory=dict)  # process index -> its exit status
    killed: set[int] = field(default_factory=set)  # killed one by one (hung, or a group restarting), not yet reaped
    kill_at: float | None = None  # a terminate's grace ends: what is left is killed
    rejoining: dict[int, set[int]] = field(default_factory=dict)  # group -> ranks stopped for its restart, not back

    def exit(self, job_id: str, worker: int, returncode: int, *, node_lost: bool = False) -> WorkerExit:
        """Record that the worker exited; its :class:`WorkerExit`."""
        self.exited[worker] = returncode
        return WorkerExit(job_id, worker, returncode, node_lost)


Run = TypeVar("Run", bound=JobRun)


class ExecutorBase(ABC, Generic[Run]):
    """What both executors do alike: plan each worker's launch, keep the job's folder and logs on this server,
    and count its workers from their starts and exits (``self._runs``)."""

    def __init__(
        self,
        jobs_dir: Path,
        ca: CertificateAuthority,
        worker_cert_lifetime: dt.timedelta,
        *,
        secrets: SecretsBroker,
        certificates: CertificateRegistry,
        grace: float,
        identities: Identities,
        memory_limit: Callable[[JobRecord], int],
        confinement: ConfinementPolicy,
    ):
        self._jobs_dir = jobs_dir
        self._ca = ca
        self._secrets = secrets
        self._grace = grace
        self._identities = identities
        self._settings = LaunchSettings(ca, certificates, worker_cert_lifetime, memory_limit, confinement)
        self._runs: dict[str, Run] = {}

    def _plan(
        self,
        job: JobRecord,
        worker: int,
        files: WorkerFiles,
        *,
        server: str,
        threads: int,
        secrets: WorkerSecrets,
        identity: Identity | None,
        devices: list[int] | list[str],
        node_ip: str | None = None,
        status: str = "",
    ) -> WorkerPlan:
        """Worker ``worker``'s launch plan (:func:`~cantata.server.executors.plan.plan_worker`)."""
        run = self._runs[job.id]
        return plan_worker(
            self._settings,
            job,
            worker,
            files=files,
            server=server,
            rendezvous=run.rendezvous[worker // group_size(job.spec)],
            threads=threads,
            secrets=secrets,
            identity=identity,
            attack=run.attack,
            fault=run.fault,
            devices=devices,
            node_ip=node_ip,
            status=status,
        )

    @staticmethod
    def store_root(job: JobRecord) -> Path | None:
        """The folder of the job's ``file://`` checkpoint store, if it has one (its own is ``<root>/<tenant>/<job>``)."""
        return stores.local_directory(job.spec.checkpoint_store)

    def workspace(self, job_id: str) -> Path:
        return self._jobs_dir / job_id

    def log_path(self, job_id: str, worker: int) -> Path:
        return self.workspace(job_id) / f"worker-{worker}.log"

    def log_tail(self, job_id: str, worker: int, lines: int = 3) -> str:
        """The last lines of a worker's log, for failure reasons."""
        try:
            text = self.log_path(job_id, worker).read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])

    def alive_workers(self, job_id: str) -> int:
        run = self._runs.get(job_id)
        return len(run.started) - len(run.exited) if run else 0

    def running_workers(self) -> int:
        return sum(len(r.started) - len(r.exited) for r in self._runs.values())

    def is_running(self, job_id: str) -> bool:
        return job_id in self._runs

    def live_workers(self) -> list[tuple[str, int, float]]:
        """(job id, process index, monotonic start time) of every worker neither exited nor killed."""
        return [
            (job_id, i, started)
            for job_id, run in self._runs.items()
            for i, started in run.started.items()
            if i not in run.exited and i not in run.killed
        ]

    def terminate(self, job_id: str) -> None:
        """Signal every worker of the job to stop now; kill whatever is left after the grace period."""
        run = self._runs.get(job_id)
        if run is None or run.kill_at is not None:
            return
        run.kill_at = time.monotonic() + self._grace
        self._signal(job_id, run, signal.SIGTERM)

    @abstractmethod
    def _signal(self, job_id: str, run: Run, sig: int) -> None:
        """Send ``sig`` to each worker of the job that has not exited."""
