"""Stragglers: workers of a job repeatedly far slower than their peers (no I/O; shared by the RPC threads).

Each round a decentralized worker reports gives its mean step time since its previous round (its
own pace: the exchange with its peers left out, see ``Round.step_time_s``). A
worker whose step time is more than ``factor`` x the median of its peers' latest
step times for ``reports`` reports in a row is a straggler; its first report at
or under that bound ends the episode. With two workers the one peer's time is
the median: for ``factor`` > 1 at most one of them can be flagged. A worker
without peers that have reported, or a window without steps (a step time of 0),
is not judged.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Change:
    """A straggler episode began (``flagged``) or ended, with the figures of the report that decided it."""

    worker: int
    flagged: bool
    step_time_s: float
    peers_median_s: float
    reports: int  # reports in a row over the bound (at the start of an episode)

    @property
    def ratio(self) -> float:
        return self.step_time_s / self.peers_median_s

    def text(self) -> str:
        """The job event's text."""
        figures = f"step time {self.step_time_s:.3g} s, {self.ratio:.1f}x the median of its peers"
        if self.flagged:
            return f"worker {self.worker} is a straggler: {figures} ({self.peers_median_s:.3g} s) for {self.reports} reports"
        return f"worker {self.worker} is no longer a straggler: {figures} ({self.peers_median_s:.3g} s)"


@dataclass
class _Job:
    latest: dict[int, float] = field(default_factory=dict)  # worker -> its latest step time
    streak: dict[int, int] = field(default_factory=dict)  # worker -> reports in a row over the bound
    flagged: set[int] = field(default_factory=set)


class StragglerDetector:
    """Judges each report of a step time against the job's other workers; tells when an episode begins or ends."""

    def __init__(self, factor: float, reports: int):
        if not factor > 1:
            raise ValueError(f"the straggler factor must be > 1, not {factor}")
        if reports < 1:
            raise ValueError(f"a straggler needs at least 1 report, not {reports}")
        self.factor = factor
        self.reports = reports
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}

    def observe(self, job_id: str, worker: int, step_time_s: float) -> Change | None:
        """Worker ``worker`` of ``job_id`` reported ``step_time_s``: the episode it begins or ends, if any."""
        if not step_time_s > 0:
            return None
        with self._lock:
            job = self._jobs.setdefault(job_id, _Job())
            job.latest[worker] = step_time_s
            peers = [t for w, t in job.latest.items() if w != worker]
            if not peers:
                return None
            median = statistics.median(peers)
            if step_time_s > self.factor * median:
                streak = job.streak[worker] = job.streak.get(worker, 0) + 1
                if streak >= self.reports and worker not in job.flagged:
                    job.flagged.add(worker)
                    return Change(worker, True, step_time_s, median, streak)
                return None
            job.streak[worker] = 0
            if worker in job.flagged:
                job.flagged.discard(worker)
                return Change(worker, False, step_time_s, median, 0)
            return None

    def counts(self, active: Iterable[str]) -> dict[str, int]:
        """Stragglers now in each of the ``active`` jobs; ended jobs are forgotten."""
        with self._lock:
            self._jobs = {job_id: self._jobs.get(job_id, _Job()) for job_id in active}
            return {job_id: len(job.flagged) for job_id, job in self._jobs.items()}
