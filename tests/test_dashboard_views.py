"""What the dashboard's job page shows of a decentralized job: the gossip edges, read back from its events."""

from __future__ import annotations

import asyncio

import pytest

from cantata.proto.v1 import common_pb2, jobs_pb2, worker_pb2
from cantata.server.broadcast import EventBroadcast
from cantata.server.dashboard.series import EventSeries
from cantata.server.dashboard.views import Views
from cantata.server.services.worker import round_text
from cantata.server.store import AnomalyRecord, NotFound, Store, utcnow
from cantata.server.store.metrics import MetricsStore


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "state.db")
    for name in ("acme", "rival"):
        store.add_tenancy_request(name, b"csr", f"sha256:{name}")
        store.approve_tenant(name, f"sha256:{name}", b"cert", common_pb2.Quota(), "root")
    yield store
    store.close()


def _round(store: Store, job_id: str, worker: int, round_: int, peers: list[int], seconds: float) -> None:
    report = worker_pb2.Round(round=round_, peers=peers, skipped=[2], inner_steps=5, seconds=seconds, deadline_s=9)
    store.append_event(
        job_id, jobs_pb2.JobEvent(kind=jobs_pb2.ROUND, step=round_, worker=worker, message=round_text(report))
    )


def test_gossip_edges_carry_their_last_round_and_screening_verdicts(store, tmp_path):
    spec = common_pb2.JobSpec(name="<b>g</b>", steps=10, algorithm="gasloc", workers=3, ranks_per_worker=1)
    job, _ = store.submit_job(store.tenant("acme"), "request-0001", spec)
    _round(store, job.id, 0, 1, [1], 0.25)
    _round(store, job.id, 0, 2, [1, 2], 1.5)
    _round(store, job.id, 1, 2, [0], 1.25)
    store.add_anomaly(AnomalyRecord(job.id, 1, 2, 2, "norm", "reject", 9.5, True, utcnow()))
    views = Views(
        store, tmp_path / "audit", lambda: None, MetricsStore(store.database), lambda job_id, worker: tmp_path / "none"
    )

    page = views.job_page(job.id, "acme")
    edges = {(e.worker, e.peer): e for e in page.edges}
    assert set(edges) == {(0, 1), (0, 2), (1, 0), (1, 2)}
    assert (edges[0, 1].round, edges[0, 1].seconds) == (2, 1.5)  # the latest round wins
    assert (edges[1, 0].round, edges[1, 0].seconds) == (2, 1.25)
    assert edges[1, 2].round == -1 and edges[1, 2].verdicts == ["reject in round 2 (norm), quarantined"]
    assert page.topology is not None and len(page.topology.nodes) == 3
    assert sorted(flagged for *_, flagged in page.topology.lines) == [False, False, True]  # 0-1, 0-2, 1-2
    assert page.job.name == "<b>g</b>"  # passed as it is: the template escapes it
    with pytest.raises(NotFound):
        views.job_page(job.id, "rival")


def test_a_stream_reconnecting_after_the_end_ends_at_once_and_one_from_the_start_gets_the_end(store):
    spec = common_pb2.JobSpec(name="j", workers=1, ranks_per_worker=1, steps=10, batch_size=4, seq_len=16)
    job, _ = store.submit_job(store.tenant("acme"), "r1", spec)
    for state in (common_pb2.STARTING, common_pb2.RUNNING, common_pb2.SUCCEEDED):
        assert store.transition(job.id, state)
    broadcast = EventBroadcast()

    async def follow(cursor: int) -> list[list]:
        broadcast.bind(asyncio.get_running_loop())
        # a stream that waited on the broadcast for an end it already had would never finish (pytest's timeout)
        return [batch async for batch in EventSeries(store, broadcast).follow(job.id, cursor)]

    from_start = asyncio.run(follow(0))
    last = [u for u in from_start[-1] if u.series == "state"][-1]
    assert (last.state, last.terminal) == ("SUCCEEDED", True)
    assert from_start[-1][-1].row is not None and from_start[-1][-1].row["what"] == "SUCCEEDED"  # its events row
    assert asyncio.run(follow(last.seq)) == []  # the browser's Last-Event-ID: nothing after it, and the stream ends
