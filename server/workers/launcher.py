"""Start and stop a job's worker processes on this node.

Each job gets a workspace ``D/jobs/<job-id>/`` (mode 0700, owned by the job's
worker user when the server runs as root) holding, per worker process, a
certificate minted for that process only, a 0600 config file, and a log.
The config (the job's keys and data-source secrets, from the secrets broker)
and the certificate's key (recorded in the certificate registry) exist only
while the job's workers run: :meth:`WorkerLauncher.scrub`
deletes them once every worker has exited, and a restarted worker gets a
config written afresh from the secrets as they are now. Workers are forked
from the zygote (:mod:`cantata.server.workers.zygote`) into the sandbox of
:mod:`cantata.server.workers.sandbox` (allow-listed environment, no inherited
descriptors, the workspace as working directory, the job's own uid, a memory
limit); each shows as ``python -m cantata.trainer.worker --config FILE --job ID``
and leads its own process group, so stopping a job reaches every process it started. Processes
that share a ``torch.distributed`` group (all of an all-reduce job, or the
ranks of one decentralized worker group) share its rendezvous, a file in the workspace (:mod:`cantata.server.workers.rendezvous`).

Workers outlive the server: neither they nor the zygote are in its process
group or session, and the zygote stays with its workers when the server goes
(:mod:`cantata.trainer.zygote`), writing each one's exit status to
``D/exits/<job-id>-<worker>.json``. A restarted server adopts (:meth:`~WorkerLauncher.adopt`)
the workers its store names, each by pid and start time (:mod:`cantata.server.workers.process_identity`),
and learns how those that exit meanwhile ended from those files. :meth:`~WorkerLauncher.detach`
lets a stopping server leave its workers running.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cantata.proto.launch import WorkerLaunch, WorkerSecrets
from cantata.security.pki import CertificateAuthority
from cantata.security.worker_confinement import DEFAULT_POLICY, ConfinementPolicy
from cantata.server.config import write_private
from cantata.server.executors.base import ExecutorBase, JobRun, WorkerExit
from cantata.server.executors.plan import WorkerFiles
from cantata.server.jobs.groups import group_size, processes
from cantata.server.network.ports import CertificateRegistry, SecretsBroker
from cantata.server.store import JobRecord, WorkerRecord
from cantata.server.workers import process_identity as proc_identity
from cantata.server.workers.rendezvous import file_rendezvous, remove_rendezvous_files
from cantata.server.workers.sandbox import (
    Identities,
    Identity,
    Lease,
    base_environment,
    give,
    prepare_job_folder,
)
from cantata.server.workers.uid_reclaim import reclaim
from cantata.server.workers.zygote import ZYGOTE_GONE, ZYGOTE_MODULE, Zygote

log = logging.getLogger(__name__)
_adopted_exits = itertools.count(1 << 32)  # after every exit the zygote numbered: adopted ones are seen late


@dataclass
class WorkerProcess:
    """A worker the zygote forked: its pid, and its exit status once the zygote reaped it."""

    pid: int
    started_at: int  # clock ticks since boot (/proc/<pid>/stat)
    zygote: Zygote

    def poll(self) -> int | None:
        return self.zygote.returncode(self.pid)

    def exit_order(self) -> int:
        """When it exited relative to other workers (smaller: earlier); only once ``poll`` gave its status."""
        return self.zygote.exit_order(self.pid)


@dataclass
class AdoptedProcess:
    """A worker an earlier server started: running while (pid, start time) runs; its status from the zygote's file.

    Its zygote (the earlier server's, which outlives it) reaps it and then writes the file: until the
    zygote has, an exit is not yet known. One that exited with no status to read and no zygote left
    to write it counts as killed.
    """

    pid: int
    started_at: int
    status: Path
    zygote: tuple[int, int] | None = None  # the (pid, start time) of the zygote that forked it, if it runs
    _code: int | None = None
    _order: int = 0

    @classmethod
    def adopt(cls, pid: int, started_at: int, status: Path) -> AdoptedProcess:
        parent = proc_identity.parent(pid)
        is_zygote = ZYGOTE_MODULE in proc_identity.command_line(parent)
        return cls(pid, started_at, status, (parent, proc_identity.start_time(parent)) if is_zygote else None)

    def poll(self) -> int | None:
        if self._code is None and not proc_identity.running(self.pid, self.started_at):
            code = self._recorded()
            if code is None and self.zygote is not None and proc_identity.running(*self.zygote):
                return None  # exited; its zygote has not written how yet
            self._code = ZYGOTE_GONE if code is None else code
            self._order = next(_adopted_exits)
        return self._code

    def _recorded(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            recorded = json.loads(self.status.read_text())
            if recorded["pid"] == self.pid:
                return int(recorded["code"])
        return None

    def exit_order(self) -> int:
        return self._order


@dataclass
class _Running(JobRun):
    procs: dict[int, WorkerProcess | AdoptedProcess]
    identity: Identity | None


def process_alive(pid: int, job_id: str) -> bool:
    """True if ``pid`` is still a worker of ``job_id`` (guards against reused pids)."""
    argv = proc_identity.command_line(pid)
    return "cantata.trainer.worker" in argv and job_id in argv


def worker_pids(config_prefix: str) -> dict[int, str]:
    """pid -> job id of every worker process on this machine whose config file's path starts with ``config_prefix``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            argv = proc_identity.command_line(int(entry.name))
            if "cantata.trainer.worker" in argv and "--config" in argv and "--job" in argv:
                config, job_id = argv[argv.index("--config") + 1], argv[argv.index("--job") + 1]
                if config.startswith(config_prefix):
                    found[int(entry.name)] = job_id
    return found


def reclaim_locally(lease: Lease) -> float:
    """Take a job's uid back on this machine (:func:`cantata.server.workers.uid_reclaim.reclaim`); the seconds it took."""
    return reclaim(lease.uid, lease.groups, [Path(f) for f in lease.folders])


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class WorkerLauncher(ExecutorBase[_Running]):
    """Spawns, signals and reaps worker processes; knows nothing of job states.

    Stopping a job's workers sends SIGTERM, then SIGKILL to what is left after ``grace`` seconds.
    """

    def __init__(
        self,
        jobs_dir: Path,
        ca: CertificateAuthority,
        server_address: str,
        worker_cert_lifetime: dt.timedelta,
        *,
        secrets: SecretsBroker,
        certificates: CertificateRegistry,
        grace: float,
        identities: Identities,
        memory_limit: Callable[[JobRecord], int],
        warm: bool = True,
        confinement: ConfinementPolicy = DEFAULT_POLICY,
    ):
        super().__init__(
            jobs_dir,
            ca,
            worker_cert_lifetime,
            secrets=secrets,
            certificates=certificates,
            grace=grace,
            identities=identities,
            memory_limit=memory_limit,
            confinement=confinement,
        )
        self._server_address = server_address
        self._zygote = Zygote(warm=warm, env=base_environment())
        self._exits = jobs_dir.with_name("exits")  # the zygotes' exit statuses, the server's alone

    def start(self) -> None:
        """Start the zygote now, so that it is warm by the first job."""
        self._exits.mkdir(mode=0o700, exist_ok=True)
        self._zygote.start()

    def _status(self, job_id: str, worker: int) -> Path:
        return self._exits / f"{job_id}-{worker}.json"

    def started_at(self, job_id: str, worker: int) -> int:
        """The start time of the job's worker process (clock ticks since boot), which with its pid names it."""
        return self._runs[job_id].procs[worker].started_at

    def adopt(
        self, job: JobRecord, workers: list[WorkerRecord], *, attack: dict | None = None, fault: dict | None = None
    ) -> int:
        """Take over the workers of ``job`` an earlier server started; returns how many still run.

        Each is its recorded pid only if that process started when recorded; those that exited
        (or whose pid now names another process) are reaped by :meth:`poll` like any exit.
        """
        ws = self.workspace(job.id)
        owner = ws.stat().st_uid if ws.is_dir() else None
        identity = self._identities.claim(job.id, owner, job.tenant)
        groups = processes(job.spec) // group_size(job.spec)
        rendezvous = [""] * groups
        for w in workers:
            with contextlib.suppress(OSError, ValueError):  # a LaunchError is a ValueError
                launch = WorkerLaunch.load(WorkerFiles.in_workspace(ws, w.idx).launch)
                rendezvous[w.idx // group_size(job.spec)] = launch.rendezvous
        adopted = _Running({}, identity, rendezvous=rendezvous, attack=attack, fault=fault)
        now = time.monotonic()  # heartbeats count from the adoption: the new server heard none yet
        for w in workers:
            adopted.procs[w.idx] = AdoptedProcess.adopt(w.pid, w.started_at, self._status(job.id, w.idx))
            adopted.started[w.idx] = now
        self._runs[job.id] = adopted
        return sum(proc.poll() is None for proc in adopted.procs.values())

    def kill_strays(self) -> list[int]:
        """SIGKILL workers of this data directory that no adopted job owns (started, never recorded); their pids."""
        strays = [
            pid
            for pid, job_id in worker_pids(f"{self._jobs_dir}/").items()
            if not (job_id in self._runs and any(p.pid == pid for p in self._runs[job_id].procs.values()))
        ]
        for pid in strays:
            kill_group(pid, signal.SIGKILL)
        for uid in self._identities.recover(reclaim_locally):
            log.warning("took back worker uid %d, which an earlier server left in use", uid)
        return strays

    def launch(self, job: JobRecord, *, attack: dict | None = None, fault: dict | None = None) -> dict[int, int]:
        """Start every worker process of ``job``; returns process index -> pid.

        The job's secrets (its keys and data-source credentials) go only into the 0600 config files.
        """
        secrets = self._secrets.worker_secrets(job)
        ws = self.workspace(job.id)
        ws.mkdir(parents=True, exist_ok=True)
        ws.chmod(0o700)
        (ws / "ca.pem").write_bytes(self._ca.cert_pem)
        rendezvous = [file_rendezvous(ws, g) for g in range(processes(job.spec) // group_size(job.spec))]
        store_root = self.store_root(job)
        folders = (ws, *([store_root / job.tenant / job.id] if store_root else []))
        running = self._runs[job.id] = _Running({}, None, rendezvous=rendezvous, attack=attack, fault=fault)
        try:
            running.identity = self._identities.acquire(job.id, job.tenant, folders)
            (ws / "tmp").mkdir(exist_ok=True)
            give(ws, running.identity)
            if store_root is not None:
                prepare_job_folder(store_root, job.tenant, job.id, running.identity)
            for i in range(processes(job.spec)):
                running.procs[i] = self._spawn(job, i, secrets)
        except BaseException:
            self.release(job.id)  # stops what did start, and scrubs
            raise
        return {i: p.pid for i, p in running.procs.items()}

    def relaunch(self, job: JobRecord, worker: int) -> int:
        """Start one exited worker of a running job again, with a fresh certificate and the secrets as they are now.

        Returns its pid; raises ``DataSourceError`` if the job's data source is gone.
        """
        running = self._runs[job.id]
        size = group_size(job.spec)
        group, ranks = worker // size, range(worker - worker % size, worker - worker % size + size)
        rejoining = running.rejoining.setdefault(group, set())
        if worker in rejoining:  # a rank of the group's old incarnation, stopped when another rank died
            rejoining.discard(worker)
        else:  # the first death of this incarnation: the whole group starts over, at a fresh rendezvous
            running.rendezvous[group] = file_rendezvous(self.workspace(job.id), group)
            rejoining.clear()
            rejoining.update(j for j in ranks if j != worker)  # dead already, or stopped now
            for j in rejoining - running.exited.keys():
                self.kill(job.id, j)
        proc = self._spawn(job, worker, self._secrets.worker_secrets(job))
        running.procs[worker] = proc
        running.exited.pop(worker, None)
        running.killed.discard(worker)
        return proc.pid

    def scrub(self, job_id: str) -> None:
        """Delete the secret-bearing files of the job's workspace: worker configs and certificate keys."""
        ws = self.workspace(job_id)
        for path in [*ws.glob("worker-*.json"), *ws.glob("worker-*.key")]:
            path.unlink(missing_ok=True)
        remove_rendezvous_files(ws)

    def kill_orphan(self, worker: WorkerRecord, job_id: str) -> None:
        """Kill a worker an earlier server left running, if its pid still names that job's worker (and start time)."""
        if process_alive(worker.pid, job_id) and (
            not worker.started_at or proc_identity.running(worker.pid, worker.started_at)
        ):
            kill_group(worker.pid, signal.SIGKILL)

    def scrub_all(self) -> None:
        """Scrub every workspace of a job with no running worker (at start: leftovers of a crash)."""
        if self._jobs_dir.is_dir():
            for ws in self._jobs_dir.iterdir():
                if ws.name not in self._runs:
                    self.scrub(ws.name)

    def _spawn(self, job: JobRecord, i: int, secrets: WorkerSecrets) -> WorkerProcess:
        files = WorkerFiles.in_workspace(self.workspace(job.id), i)
        running = self._runs[job.id]
        threads = max(1, (os.cpu_count() or 1) // processes(job.spec))
        plan = self._plan(
            job,
            i,
            files,
            server=self._server_address,
            threads=threads,
            secrets=secrets,
            identity=running.identity,
            devices=self.devices(job.id, i),
            status=str(self._status(job.id, i)),
        )
        files.cert.write_bytes(plan.certificate.cert_pem)
        write_private(files.key, plan.certificate.key_pem)
        write_private(files.launch, plan.launch.to_json().encode())
        files.log.touch(mode=0o600)
        for path in (files.cert, files.key, files.launch, files.log):
            give(path, running.identity)
        self._status(job.id, i).unlink(missing_ok=True)
        running.started[i] = time.monotonic()
        pid = self._zygote.spawn(plan.request)
        return WorkerProcess(pid, proc_identity.start_time(pid), self._zygote)

    def devices(self, job_id: str, worker: int) -> list[int]:
        """The GPUs a worker may use (none here)."""
        return []

    def kill(self, job_id: str, worker: int) -> None:
        """SIGKILL one worker's process group now (it hung); ``poll`` reaps it like any exit."""
        running = self._runs[job_id]
        running.killed.add(worker)
        kill_group(running.procs[worker].pid, signal.SIGKILL)

    def _signal(self, job_id: str, run: _Running, sig: int) -> None:
        for i, proc in run.procs.items():
            if i not in run.exited:
                kill_group(proc.pid, sig)

    def poll(self) -> list[WorkerExit]:
        """Reap exited workers, and SIGKILL those still there past a terminate's grace."""
        exits = []
        for job_id, running in self._runs.items():
            ended = [
                (i, proc, code)
                for i, proc in running.procs.items()
                if i not in running.exited and (code := proc.poll()) is not None
            ]
            # In the order they died: the worker killed first is the cause, not a peer that failed because of it.
            for i, _proc, code in sorted(ended, key=lambda e: e[1].exit_order()):
                exits.append(running.exit(job_id, i, code))
            if running.kill_at is not None and time.monotonic() >= running.kill_at:
                self._signal(job_id, running, signal.SIGKILL)
        return exits

    def finished_jobs(self) -> list[str]:
        """Jobs whose workers have all exited; ``release`` them once settled."""
        return [job_id for job_id, r in self._runs.items() if len(r.exited) == len(r.procs)]

    def release(self, job_id: str) -> None:
        """Forget a job whose workers have all exited, take its uid back, and scrub its secrets from the workspace.

        The uid is free again only once no process of it is left and the job's folders are the server's
        (:func:`reclaim_locally`); a uid that cannot be taken back is never used again.
        """
        running = self._runs.pop(job_id)
        for i, proc in running.procs.items():
            if proc_identity.start_time(proc.pid) in (0, proc.started_at):  # not a process that reused the pid since
                kill_group(proc.pid, signal.SIGKILL)  # stray children of a worker
            self._zygote.forget(proc.pid)
            self._status(job_id, i).unlink(missing_ok=True)
        self._identities.release(job_id, reclaim_locally)
        self.scrub(job_id)

    def stop_all(self) -> None:
        """Stop every job's workers and wait until they are gone."""
        for job_id in list(self._runs):
            self.terminate(job_id)
        deadline = time.monotonic() + self._grace + 5
        while self._runs and time.monotonic() < deadline:
            self.poll()
            for job_id in self.finished_jobs():
                self.release(job_id)
            time.sleep(0.05)
        self._zygote.close()

    def detach(self) -> None:
        """Let go of every worker, leaving them running (a server that stops for an upgrade): the next adopts them."""
        self._runs.clear()
        self._zygote.detach()
