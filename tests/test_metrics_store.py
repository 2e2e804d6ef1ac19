"""The metrics history on a real database: filters, cursors, gaps, the bound on long runs, and deletion."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from cantata.server.database import Database
from cantata.server.store.metrics import MetricsStore, UnknownMetric


@pytest.fixture
def metrics(tmp_path: Path):
    db = Database(tmp_path / "state.db")
    yield MetricsStore(db, series_points=8)
    db.close()


def test_points_come_back_oldest_first_filtered_by_name_time_and_cursor(metrics: MetricsStore) -> None:
    metrics.record("job-a", 10, 0, {"loss": 2.5, "lr": 0.01})
    metrics.record("job-b", 10, 0, {"loss": 9.0})  # another job's points never mix in
    before = time.time()
    metrics.record("job-a", 20, 0, {"loss": 2.0, "lr": 0.009})
    metrics.record("job-a", 20, 1, {"bytes_sent_to_peer": 4096.0}, peer=3)

    rows = metrics.rows("job-a")
    assert [(r.step, r.name, r.value, r.worker, r.peer) for r in rows] == [
        (10, "loss", 2.5, 0, None),
        (10, "lr", 0.01, 0, None),
        (20, "loss", 2.0, 0, None),
        (20, "lr", 0.009, 0, None),
        (20, "bytes_sent_to_peer", 4096.0, 1, 3),
    ]
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)
    assert [r.value for r in metrics.rows("job-a", ["loss"])] == [2.5, 2.0]
    assert [r.step for r in metrics.rows("job-a", ["loss"], since=before)] == [20]
    assert [r.name for r in metrics.rows("job-a", after=rows[2].seq)] == ["lr", "bytes_sent_to_peer"]
    assert len(metrics.rows("job-a", limit=2)) == 2
    assert metrics.latest(["job-a"]) == {"job-a": {"loss": 2.0, "lr": 0.009}}


def test_a_value_that_is_not_a_number_is_a_gap_and_an_unknown_name_is_refused(metrics: MetricsStore) -> None:
    metrics.record("job-a", 1, 0, {"loss": math.nan})
    assert math.isnan(metrics.rows("job-a")[0].value)
    with pytest.raises(UnknownMetric, match="'accuracy'"):
        metrics.record("job-a", 2, 0, {"accuracy": 0.5})
    with pytest.raises(UnknownMetric):
        metrics.rows("job-a", ["accuracy"])
    assert len(metrics.rows("job-a")) == 1  # the refused record left nothing behind


def test_a_long_run_is_thinned_to_the_cap_and_still_spans_the_whole_run(metrics: MetricsStore) -> None:
    for step in range(1, 101):
        metrics.record("job-a", step, 0, {"loss": 1.0 / step})
        assert len(metrics.rows("job-a")) <= 8
    metrics.record("job-a", 100, 1, {"loss": 0.5})  # another worker's series has a cap of its own
    steps = [r.step for r in metrics.rows("job-a", ["loss"]) if r.worker == 0]
    assert 4 <= len(steps) <= 8
    assert steps[0] == 1 and steps[-1] == 100  # the first point and the newest are kept
    assert steps == sorted(steps)
    assert [r.step for r in metrics.rows("job-a") if r.worker == 1] == [100]


def test_deleting_a_job_forgets_its_history(metrics: MetricsStore) -> None:
    metrics.record("job-a", 1, 0, {"loss": 1.0})
    metrics.record("job-b", 1, 0, {"loss": 1.0})
    metrics.delete("job-a")
    assert metrics.rows("job-a") == [] and len(metrics.rows("job-b")) == 1
