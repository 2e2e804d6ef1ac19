"""When each worker process was last heard from, and which have been silent too long.

Every report a worker sends (a heartbeat, which its reporter sends in the
background, or any other) counts as a sign of life. The scheduler asks on each
tick which live workers have been silent for longer than the timeout, counting
from their start when they have not reported yet; the lifecycle kills them as
hung (:meth:`~cantata.server.jobs.lifecycle.JobLifecycle.worker_silent`). Kept in
memory: after a server restart every worker is new.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable


class Heartbeats:
    """Last-seen times of worker processes, keyed by (job id, process index)."""

    def __init__(self, timeout: float, *, clock: Callable[[], float] = time.monotonic):
        self.timeout = timeout
        self._clock = clock
        self._seen: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    @property
    def interval(self) -> float:
        """How often a worker should report: four beats per timeout."""
        return self.timeout / 4

    def seen(self, job_id: str, worker: int) -> None:
        with self._lock:
            self._seen[(job_id, worker)] = self._clock()

    def alive(self) -> int:
        """How many worker processes have been heard from within the timeout."""
        now = self._clock()
        with self._lock:
            return sum(1 for last in self._seen.values() if now - last <= self.timeout)

    def silent(self, live: Iterable[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
        """(job id, worker, seconds silent) of the ``live`` workers (job id, worker, start time) past the timeout.

        A report from before a worker's (re)start does not count; workers no longer live are forgotten.
        """
        now = self._clock()
        silent = []
        with self._lock:
            seen = {}
            for job_id, worker, started in live:
                last = max(started, self._seen.get((job_id, worker), started))
                seen[(job_id, worker)] = last
                if now - last > self.timeout:
                    silent.append((job_id, worker, now - last))
            self._seen = seen
        return silent
