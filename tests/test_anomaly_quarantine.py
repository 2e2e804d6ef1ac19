import pytest

from cantata.security.anomaly import (
    AnomalyKind,
    CheckResult,
    Quarantine,
    QuarantinePolicy,
    ScreeningResult,
    Verdict,
)


def result(peer: int, verdict: Verdict) -> ScreeningResult:
    return ScreeningResult(peer, (CheckResult("finite", 0.0, Verdict.ACCEPT), CheckResult("cosine", -0.9, verdict)))


def test_quarantined_after_k_rejections_within_the_window():
    quarantine = Quarantine(worker=0, policy=QuarantinePolicy(rejections=3, window=5))
    assert [e.kind for e in quarantine.record(0, result(2, Verdict.REJECT))] == [AnomalyKind.ANOMALY_DETECTED]
    assert [e.kind for e in quarantine.record(2, result(2, Verdict.REJECT))] == [AnomalyKind.ANOMALY_DETECTED]
    assert not quarantine.is_quarantined(2)
    events = quarantine.record(4, result(2, Verdict.REJECT))
    assert [e.kind for e in events] == [AnomalyKind.ANOMALY_DETECTED, AnomalyKind.PEER_QUARANTINED]
    assert quarantine.is_quarantined(2)
    assert events[1].to_dict() == {
        "kind": "peer_quarantined",
        "worker": 0,
        "peer": 2,
        "round": 4,
        "scores": {"finite": 0.0, "cosine": -0.9},
        "rejections_in_window": 3,
    }


def test_rejections_spread_beyond_the_window_do_not_quarantine():
    quarantine = Quarantine(worker=0, policy=QuarantinePolicy(rejections=3, window=5))
    for round in (0, 5, 10, 15):
        quarantine.record(round, result(1, Verdict.REJECT))
    assert not quarantine.is_quarantined(1)


def test_accepted_and_clipped_updates_raise_no_events():
    quarantine = Quarantine(worker=0, policy=QuarantinePolicy(rejections=1, window=5))
    assert quarantine.record(0, result(1, Verdict.ACCEPT)) == []
    assert quarantine.record(1, result(1, Verdict.CLIP)) == []
    assert not quarantine.is_quarantined(1)


def test_rejections_in_the_window_after_a_restart_are_reported_but_do_not_count():
    quarantine = Quarantine(worker=0, policy=QuarantinePolicy(rejections=3, window=5))
    quarantine.record(0, result(1, Verdict.REJECT))  # before the restart: forgotten with it
    quarantine.grace(1, 10)  # peer 1 was restarted and rejoins at round 10, from an older checkpoint
    assert [quarantine.in_grace(1, r) for r in (9, 10, 14, 15)] == [True, True, True, False]
    assert not quarantine.in_grace(2, 10)  # the others' grace is their own
    for round in range(10, 15):
        events = quarantine.record(round, result(1, Verdict.REJECT))
        assert [e.kind for e in events] == [AnomalyKind.ANOMALY_DETECTED] and events[0].rejections_in_window == 0
    assert not quarantine.is_quarantined(1)
    for round in (15, 16):  # the grace is over: rejections count again
        quarantine.record(round, result(1, Verdict.REJECT))
    assert not quarantine.is_quarantined(1)
    assert AnomalyKind.PEER_QUARANTINED in [e.kind for e in quarantine.record(17, result(1, Verdict.REJECT))]
    assert quarantine.is_quarantined(1)


def test_quarantine_is_for_the_job_and_reported_once():
    quarantine = Quarantine(worker=0, policy=QuarantinePolicy(rejections=1, window=1))
    assert len(quarantine.record(0, result(1, Verdict.REJECT))) == 2
    assert quarantine.record(50, result(1, Verdict.REJECT)) == []
    assert quarantine.is_quarantined(1)


def test_a_quarantined_peers_weight_goes_to_self():
    quarantine = Quarantine(worker=0, policy=QuarantinePolicy(rejections=1, window=1))
    quarantine.record(0, result(2, Verdict.REJECT))
    row = quarantine.mixing_row({0: 0.5, 1: 0.25, 2: 0.25})
    assert row == {0: 0.75, 1: 0.25}
    assert sum(row.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        quarantine.mixing_row({1: 0.5, 2: 0.5})


def test_policy_validation():
    with pytest.raises(ValueError):
        QuarantinePolicy(rejections=0)
