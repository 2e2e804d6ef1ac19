"""How many worker failures a job survives, and how long it waits before each restart.

A job's ``max_failures`` (default 3) is its budget, bounded by the server's
``max_worker_restarts``. An all-reduce or single job restarts its whole worker
group from its latest checkpoint after each failure; a gasloc or diloco job
restarts the dead worker group alone, each up to the budget. Restarts wait
``backoff`` seconds after the first failure, twice as long after each next
one, never more than ``max_backoff``. Server restarts are no failures.
"""

from __future__ import annotations

from dataclasses import dataclass

from cantata.proto.jobfields import DEFAULT_MAX_FAILURES
from cantata.proto.v1 import common_pb2 as pb


@dataclass(frozen=True)
class RestartPolicy:
    max_failures: int  # the server's bound on every job's max_failures
    backoff: float = 1.0
    max_backoff: float = 30.0

    def budget(self, spec: pb.JobSpec) -> int:
        """The failures a job of ``spec`` survives: its ``max_failures``, at most the server's bound."""
        asked = spec.max_failures if spec.HasField("max_failures") else DEFAULT_MAX_FAILURES
        return max(0, min(asked, self.max_failures))

    def delay(self, failures: int) -> float:
        """Seconds to wait before the restart that follows the ``failures``-th failure."""
        return min(self.backoff * 2 ** max(0, failures - 1), self.max_backoff)
