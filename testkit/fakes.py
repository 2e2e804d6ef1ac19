"""The audit log, the worker processes and the executor as the lifecycle and the scheduler see them, for tests
without processes.

Each fake is typed against the protocol the server code takes
(:class:`~cantata.server.network.ports.AuditSink`,
:class:`~cantata.server.network.ports.WorkerProcesses`,
:class:`~cantata.server.executors.Executor`), so mypy says when a protocol
grows and a fake falls behind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cantata.security.audit import AuditEntry, AuditLogUnavailable
from cantata.server.executors import NotPlaceable, WorkerExit
from cantata.server.store import JobRecord, WorkerRecord

FULL = "the audit log cannot be written: No space left on device"


@dataclass
class FakeAudit:
    """An audit log that keeps each record as the dict of its ``append`` arguments.

    It refuses (raises :class:`AuditLogUnavailable`, as a full disk does) every append while ``down`` and
    each append of a ``refused`` action; while ``fail`` is set, every append raises that instead.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False
    refused: set[str] = field(default_factory=set)
    fail: Exception | None = None

    def append(self, actor: str, action: str, **fields: Any) -> None:
        self._check(action)
        self.records.append({"actor": actor, "action": action, **fields})

    def append_all(self, entries: Sequence[AuditEntry]) -> None:
        for entry in entries:
            self._check(entry.action)
        self.records.extend(dataclasses.asdict(entry) for entry in entries)

    def require_writable(self) -> None:
        self._check("")

    def failure(self) -> str | None:
        """Why the log cannot be written now (the scheduler's ``audit_failure``)."""
        return FULL if self.down else None

    def of(self, resource: str) -> list[tuple[str, dict]]:
        """(action, details) of each record about ``resource``."""
        return [(r["action"], r.get("details") or {}) for r in self.records if r.get("resource") == resource]

    def actions(self, resource: str) -> list[str]:
        return [action for action, _ in self.of(resource)]

    def _check(self, action: str) -> None:
        if self.fail is not None:
            raise self.fail
        if self.down or action in self.refused:
            raise AuditLogUnavailable(FULL)


@dataclass
class FakeWorkers:
    """A launcher's worker processes as the lifecycle acts on them: which jobs have processes, what was done to them.

    ``running``: job id -> processes alive. A relaunch raises ``refuse_restart`` if set, else returns a pid.
    """

    running: dict[str, int] = field(default_factory=dict)
    logs: dict[tuple[str, int], str] = field(default_factory=dict)
    refuse_restart: Exception | None = None
    relaunched: list[tuple[str, int]] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    scrubbed: list[str] = field(default_factory=list)
    killed: list[tuple[str, int]] = field(default_factory=list)

    def relaunch(self, job: JobRecord, worker: int) -> int:
        if self.refuse_restart:
            raise self.refuse_restart
        self.relaunched.append((job.id, worker))
        return 2000 + worker

    def started_at(self, job_id: str, worker: int) -> int:
        return 500 + worker

    def alive_workers(self, job_id: str) -> int:
        return self.running.get(job_id, 0)

    def is_running(self, job_id: str) -> bool:
        return job_id in self.running

    def terminate(self, job_id: str) -> None:
        self.terminated.append(job_id)

    def scrub(self, job_id: str) -> None:
        self.scrubbed.append(job_id)

    def kill(self, job_id: str, worker: int) -> None:
        self.killed.append((job_id, worker))

    def log_tail(self, job_id: str, worker: int) -> str:
        return self.logs.get((job_id, worker), "")


@dataclass
class FakeExecutor(FakeWorkers):
    """An executor that starts nothing: it places a job while one of ``slots`` is free (``None``: always) and its
    steps are at most ``most_steps``, reports the ``exits`` and ``finished`` jobs it is given, and records the rest."""

    slots: int | None = None
    most_steps: int = 1_000_000
    looked_at: list[str] = field(default_factory=list)
    launched: list[str] = field(default_factory=list)
    exits: list[WorkerExit] = field(default_factory=list)
    polls: int = 0
    finished: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def start(self) -> None:
        pass

    def placement(self, job: JobRecord) -> None:
        self.looked_at.append(job.id)
        if job.spec.steps > self.most_steps:
            raise NotPlaceable(f"needs {job.spec.steps} steps; this node runs at most {self.most_steps}", never=True)
        if self.slots is not None and len(self.launched) >= self.slots:
            raise NotPlaceable("no free slot")

    def launch(self, job: JobRecord, *, attack: dict | None = None, fault: dict | None = None) -> dict[int, int]:
        self.launched.append(job.id)
        return {worker: 100 * len(self.launched) + worker for worker in range(max(job.spec.workers, 1))}

    def poll(self) -> list[WorkerExit]:
        self.polls += 1
        exits, self.exits = self.exits, []
        return exits

    def finished_jobs(self) -> list[str]:
        return list(self.finished)

    def release(self, job_id: str) -> None:
        self.finished.remove(job_id)
        self.released.append(job_id)

    def running_workers(self) -> int:
        return len(self.launched)

    def live_workers(self) -> list[tuple[str, int, float]]:
        return []  # none to check for heartbeats

    def workspace(self, job_id: str) -> Path:
        raise NotImplementedError("a fake executor has no workspaces")

    def log_path(self, job_id: str, worker: int) -> Path:
        raise NotImplementedError("a fake executor has no logs")

    def adopt(
        self, job: JobRecord, workers: list[WorkerRecord], *, attack: dict | None = None, fault: dict | None = None
    ) -> int | None:
        return None  # its workers do not outlive their server: the job is requeued

    def kill_orphan(self, worker: WorkerRecord, job_id: str) -> None:
        pass

    def kill_strays(self) -> list[int]:
        return []

    def detach(self) -> None:
        pass

    def scrub_all(self) -> None:
        pass

    def stop_all(self) -> None:
        pass
