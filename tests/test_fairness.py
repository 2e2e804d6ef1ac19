"""The start order across tenants (cantata.server.jobs.fairness), on its own: no store, no server."""

from __future__ import annotations

from cantata.server.jobs.fairness import QueueHead, turn


def _head(
    tenant: str, *, active: int = 0, last_start: int = 0, queued_at: str = "2026-01-01T00:00:00.000", order: int = 0
):
    return QueueHead(f"job-{tenant}", tenant, active, last_start, queued_at, order)


def _order(*heads: QueueHead) -> list[str]:
    return [h.tenant for h in sorted(heads, key=turn)]


def test_the_tenant_with_fewer_active_jobs_goes_first_whoever_queued_first():
    assert _order(
        _head("busy", active=2, queued_at="2026-01-01T00:00:00.000"), _head("idle", queued_at="2026-01-02")
    ) == [
        "idle",
        "busy",
    ]


def test_among_equally_busy_tenants_the_one_that_started_least_recently_goes_first():
    early = _head("early", last_start=7, queued_at="2026-01-01T00:00:00.000")  # queued first, started last
    late = _head("late", last_start=3, queued_at="2026-01-01T00:00:05.000")
    never = _head("never", last_start=0, queued_at="2026-01-01T00:00:09.000")  # never started a job: first
    assert _order(early, late, never) == ["never", "late", "early"]


def test_ties_go_to_the_head_queued_first_then_to_the_one_inserted_first():
    same = "2026-01-01T00:00:00.000"
    assert _order(
        _head("b", queued_at=same, order=2), _head("a", queued_at=same, order=1), _head("c", queued_at="2025-12-31")
    ) == [
        "c",
        "a",
        "b",
    ]


def test_taking_turns_with_one_slot_gives_every_tenant_its_first_start_before_any_second():
    """A simulation of one slot: the tenant that started is charged the start; a job ends before the next."""
    queued = {"a": 3, "b": 2, "c": 2}  # a queued all its jobs first
    submitted = {"a": "2026-01-01T00:00:00.001", "b": "2026-01-01T00:00:00.002", "c": "2026-01-01T00:00:00.003"}
    last_start = dict.fromkeys(queued, 0)
    started: list[str] = []
    for clock in range(1, 8):
        heads = [_head(t, last_start=last_start[t], queued_at=submitted[t]) for t, n in queued.items() if n]
        tenant = min(heads, key=turn).tenant
        started.append(tenant)
        queued[tenant] -= 1
        last_start[tenant] = clock
    assert started == ["a", "b", "c", "a", "b", "c", "a"]
