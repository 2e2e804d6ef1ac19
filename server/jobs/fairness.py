"""Which tenant's queued job starts next: fair across tenants, free of I/O.

The scheduler looks only at the queue's heads (each tenant's oldest queued job that may be placed). Among them
the next to start is the head of the tenant

1. with the fewest active (starting, running, cancelling) jobs, so a tenant with many running jobs waits for
   those with few;
2. then whose last start is the oldest (a tenant that never started a job first), so when slots are scarce
   tenants take turns: every tenant with queued jobs gets a start before any gets a second one;
3. then whose head was queued first (submission order, insertion order within the same millisecond).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueHead:
    """One tenant's oldest queued job, with what its turn depends on."""

    job_id: str
    tenant: str
    active: int  # the tenant's jobs starting, running or cancelling
    last_start: int  # when the tenant's latest job start was, as a start counter (0: none yet)
    queued_at: str  # the job's creation time (ISO 8601, UTC)
    queued_order: int  # insertion order, for jobs queued in the same millisecond


def turn(head: QueueHead) -> tuple[int, int, str, int]:
    """The sort key of ``head``'s turn: the smallest goes first."""
    return head.active, head.last_start, head.queued_at, head.queued_order
