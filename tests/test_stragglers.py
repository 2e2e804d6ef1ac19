"""The straggler rule: over factor x the peers' median for N reports in a row, once per episode, cleared on recovery."""

from __future__ import annotations

import pytest

from cantata.server.jobs.stragglers import StragglerDetector


def _round(detector: StragglerDetector, times: dict[int, float], job: str = "j") -> list:
    """Every worker reports once, in index order; the changes the reports made."""
    return [c for w, t in times.items() if (c := detector.observe(job, w, t)) is not None]


def test_a_worker_slow_for_n_reports_in_a_row_is_flagged_once_and_cleared_when_it_recovers():
    detector = StragglerDetector(factor=2.0, reports=3)
    assert _round(detector, {0: 0.25, 1: 0.3, 2: 0.9}) == []  # 0.9 > 2 x 0.275: 1 in a row
    assert _round(detector, {0: 0.25, 1: 0.3, 2: 0.9}) == []  # 2 in a row
    [flagged] = _round(detector, {0: 0.25, 1: 0.3, 2: 0.9})
    assert (flagged.worker, flagged.flagged, flagged.reports) == (2, True, 3)
    assert flagged.peers_median_s == pytest.approx(0.275) and flagged.ratio == pytest.approx(0.9 / 0.275)
    assert (
        flagged.text()
        == "worker 2 is a straggler: step time 0.9 s, 3.3x the median of its peers (0.275 s) for 3 reports"
    )
    assert detector.counts(["j"]) == {"j": 1}
    assert _round(detector, {0: 0.25, 1: 0.3, 2: 0.9}) == []  # still the same episode: no second event
    [cleared] = _round(detector, {0: 0.25, 1: 0.3, 2: 0.5})
    assert (cleared.worker, cleared.flagged) == (2, False)
    assert cleared.text().startswith("worker 2 is no longer a straggler: step time 0.5 s")
    assert detector.counts(["j"]) == {"j": 0}


def test_a_fast_report_between_slow_ones_starts_the_count_again():
    detector = StragglerDetector(factor=2.0, reports=3)
    for slow in (0.9, 0.9, 0.3, 0.9, 0.9):
        assert _round(detector, {0: 0.25, 1: 0.3, 2: slow}) == []
    assert [c.worker for c in _round(detector, {0: 0.25, 1: 0.3, 2: 0.9})] == [2]


def test_the_bound_is_strict_and_uses_the_median_so_one_slow_peer_does_not_hide_another():
    detector = StragglerDetector(factor=2.0, reports=1)
    assert _round(detector, {0: 0.2, 1: 0.2, 2: 0.4}) == []  # exactly 2x: not over the bound
    # workers 3 and 4 are both slow: the median of each one's peers is still the fast majority's time
    changes = _round(detector, {0: 0.2, 1: 0.2, 2: 0.2, 3: 1.0, 4: 1.0})
    assert [(c.worker, c.flagged) for c in changes] == [(3, True), (4, True)]


def test_two_workers_the_slower_one_against_its_one_peer_and_no_peer_no_judgement():
    detector = StragglerDetector(factor=2.0, reports=2)
    assert detector.observe("j", 0, 5.0) is None  # no peer has reported yet
    for _ in range(3):
        changes = _round(detector, {0: 0.1, 1: 0.5})
    assert changes == []  # worker 1 was flagged in the 2nd round, once
    assert detector.counts(["j"]) == {"j": 1}
    assert detector.observe("j", 1, 0.0) is None  # a window without steps is not judged
    assert detector.counts(["j"]) == {"j": 1}


def test_jobs_are_apart_and_ended_jobs_forgotten():
    detector = StragglerDetector(factor=2.0, reports=1)
    _round(detector, {0: 0.1, 1: 0.1, 2: 1.0}, job="a")
    assert _round(detector, {0: 1.0}, job="b") == []  # a's workers are not b's peers
    assert detector.counts(["a", "b"]) == {"a": 1, "b": 0}
    assert detector.counts(["b"]) == {"b": 0}
    assert detector.counts(["a"]) == {"a": 0}  # a ended and was forgotten: a new run starts clean


@pytest.mark.parametrize(("factor", "reports"), [(1.0, 3), (0.5, 3), (2.0, 0)])
def test_settings_that_could_flag_every_worker_are_refused(factor, reports):
    with pytest.raises(ValueError):
        StragglerDetector(factor, reports)
