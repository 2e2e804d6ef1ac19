"""The one interface both executors implement, as the scheduler, the lifecycle and the services use it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cantata.server.store import JobRecord, WorkerRecord


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
