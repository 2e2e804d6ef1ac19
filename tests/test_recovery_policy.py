"""The recovery policy's parts without I/O: the z-score detector, the rollback budget, the fault plan."""

from __future__ import annotations

import math
from typing import Any

import pytest

from cantata.proto.faults import DEFAULT_SCALE, Fault, FaultKind, InvalidFault, plan_fault
from cantata.trainer.recovery import (
    Cause,
    NonfiniteLoss,
    Recovery,
    RecoveryPolicy,
    RollbacksExhausted,
    SpikeDetector,
)

NOISY = [3.0, 3.1, 2.9, 3.05, 2.95]  # mean 3.0, population stdev ~0.0707


def test_the_detector_says_nothing_until_its_window_is_full():
    detector = SpikeDetector(zscore=3.0, window=5)
    assert [detector.observe(x) for x in [3.0, 3.0, 3.0, 3.0]] == [None] * 4
    assert detector.observe(3.0) is None  # the fifth fills the window (and is not compared)
    assert detector.observe(100.0) is not None


def test_a_loss_past_the_zscore_is_a_spike_and_one_below_it_is_not():
    detector = SpikeDetector(zscore=3.0, window=5)
    for x in NOISY:
        detector.observe(x)
    assert detector.observe(3.2) is None  # z ~ 2.8
    detector = SpikeDetector(zscore=3.0, window=5)
    for x in NOISY:
        detector.observe(x)
    z = detector.observe(3.3)
    assert z == pytest.approx(0.3 / 0.0707, rel=0.01)


def test_falling_losses_are_never_spikes():
    detector = SpikeDetector(zscore=1.0, window=3)
    assert all(detector.observe(10.0 - i) is None for i in range(10))


def test_a_spike_stays_out_of_the_window_so_it_is_flagged_again():
    detector = SpikeDetector(zscore=3.0, window=5)
    for x in NOISY:
        detector.observe(x)
    assert detector.observe(30.0) is not None
    assert detector.observe(30.0) is not None  # the window still holds the calm losses
    assert detector.observe(3.0) is None


def test_the_window_slides():
    detector = SpikeDetector(zscore=3.0, window=3)
    assert [detector.observe(x) for x in [1.0, 1.1, 0.9, 1.2, 1.25, 1.3]] == [None] * 6  # a slow rise
    assert detector.observe(1.35) is None  # z 2.4 over [1.2, 1.25, 1.3]; over the first three it would be 4.3


def test_a_flat_window_gives_a_finite_zscore():
    detector = SpikeDetector(zscore=3.0, window=3)
    for _ in range(3):
        detector.observe(2.0)
    z = detector.observe(2.5)
    assert z is not None and math.isfinite(z)
    assert detector.observe(2.0) is None


def test_non_finite_losses_neither_spike_nor_enter_the_window():
    detector = SpikeDetector(zscore=3.0, window=2)
    assert detector.observe(math.nan) is None and detector.observe(math.inf) is None
    detector.observe(1.0)
    assert detector.observe(1.0) is None  # fills the window: the NaN did not count
    assert detector.observe(50.0) is not None


@pytest.mark.parametrize(("zscore", "window"), [(0.0, 5), (-1.0, 5), (3.0, 1)])
def test_a_detector_refuses_meaningless_settings(zscore, window):
    with pytest.raises(ValueError, match="zscore > 0 and window >= 2"):
        SpikeDetector(zscore, window)


def policy(**changes) -> RecoveryPolicy:
    base: dict[str, Any] = {
        "on_nonfinite": "rollback",
        "spike_zscore": 3.0,
        "spike_window": 3,
        "max_rollbacks": 2,
        "lr_scale": 0.5,
    }
    return RecoveryPolicy(**(base | changes))


def test_non_finite_losses_follow_on_nonfinite():
    assert Recovery(policy()).check(7, math.nan).cause is Cause.NONFINITE
    assert Recovery(policy(on_nonfinite="warn")).check(7, math.inf) is None
    with pytest.raises(NonfiniteLoss, match="step 7: the loss is nan"):
        Recovery(policy(on_nonfinite="fail")).check(7, math.nan)


def test_warn_alone_is_inactive_and_a_spike_zscore_activates_it():
    assert not policy(on_nonfinite="warn", spike_zscore=None).active
    assert policy(on_nonfinite="warn").active
    assert policy(spike_zscore=None).active


def test_rollbacks_scale_the_lr_and_are_bounded():
    recovery = Recovery(policy())
    trip = recovery.check(9, math.nan)
    assert trip is not None
    recovery.roll_back(9, trip, checkpoint=5)
    recovery.roll_back(9, trip, checkpoint=5)
    assert (recovery.rollbacks, recovery.lr_scale) == (2, 0.25)
    with pytest.raises(RollbacksExhausted, match="already rolled back 2 times"):
        recovery.roll_back(9, trip, checkpoint=5)


def test_there_is_no_rollback_without_a_checkpoint():
    recovery = Recovery(policy())
    trip = recovery.check(3, math.nan)
    assert trip is not None
    with pytest.raises(RollbacksExhausted, match="no checkpoint"):
        recovery.roll_back(3, trip, checkpoint=0)
    assert recovery.rollbacks == 0


def test_a_fault_fires_at_its_step_on_its_workers_as_often_as_planned():
    fault = plan_fault("loss_spike", 5, 0.0, 2, [1], steps=10, processes=2)
    assert fault == Fault(FaultKind.LOSS_SPIKE, 5, DEFAULT_SCALE, 2, (1,))
    assert fault.factor(5, 1, fired=0) == DEFAULT_SCALE
    assert fault.factor(5, 1, fired=1) == DEFAULT_SCALE
    assert fault.factor(5, 1, fired=2) == 1.0
    assert fault.factor(5, 0, fired=0) == 1.0 and fault.factor(4, 1, fired=0) == 1.0
    nonfinite = plan_fault("nonfinite", 3, 0.0, 0, [], steps=10, processes=2)
    assert math.isnan(nonfinite.factor(3, 0, fired=0)) and math.isnan(nonfinite.factor(3, 1, fired=0))
    assert Fault.from_dict(fault.to_dict()) == fault


@pytest.mark.parametrize(
    ("kind", "step", "scale", "times", "workers", "match"),
    [
        ("bitflip", 5, 0.0, 0, [], "unknown fault 'bitflip'"),
        ("loss_spike", 0, 0.0, 0, [], r"step must be in 1\.\.10"),
        ("loss_spike", 11, 0.0, 0, [], r"step must be in 1\.\.10"),
        ("loss_spike", 5, -2.0, 0, [], "scale must be a finite number > 0"),
        ("loss_spike", 5, math.inf, 0, [], "scale must be a finite number > 0"),
        ("loss_spike", 5, 0.0, 101, [], r"times must be in 1\.\.100"),
        ("loss_spike", 5, 0.0, 0, [2], r"workers must be distinct processes of 0\.\.1"),
        ("loss_spike", 5, 0.0, 0, [1, 1], "distinct"),
    ],
)
def test_a_malformed_fault_is_refused_with_its_reason(kind, step, scale, times, workers, match):
    with pytest.raises(InvalidFault, match=match):
        plan_fault(kind, step, scale, times, workers, steps=10, processes=2)
