"""The local executor: a job's workers are child processes of this server, forked from its zygote.

It is :class:`~cantata.server.launcher.WorkerLauncher` (the sandbox, the
per-worker certificates and configs), plus placement on this node: at most
``slots`` worker processes at once.
"""

from __future__ import annotations

from cantata.server.executors.base import NotPlaceable
from cantata.server.groups import processes
from cantata.server.launcher import WorkerLauncher
from cantata.server.store import JobRecord


class LocalExecutor(WorkerLauncher):
    """Workers on this machine, ``slots`` processes at most."""

    def __init__(self, *args, slots: int, **kwargs):
        super().__init__(*args, **kwargs)
        self._slots = slots

    def placement(self, job: JobRecord) -> None:
        wanted = processes(job.spec)
        if wanted > self._slots:
            raise NotPlaceable(f"needs {wanted} worker processes; this node runs at most {self._slots}", never=True)
        free = self._slots - self.running_workers()
        if wanted > free:
            raise NotPlaceable(f"waiting for {wanted} worker slots ({free} free)")
