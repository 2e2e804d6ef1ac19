"""The round deadline: a job's fixed value, or adaptive from the last complete rounds within its bounds."""

import pytest

from cantata.proto.jobfields import ROUND_DEADLINE_BOUNDS
from cantata.trainer.gasloc.deadline import FIRST_DEADLINE_S, RoundDeadline


def test_a_fixed_deadline_ignores_round_times():
    deadline = RoundDeadline(7.5)
    deadline.record(100.0)
    assert deadline.seconds == 7.5


def test_the_adaptive_deadline_follows_the_slowest_of_the_last_eight_rounds_within_bounds():
    deadline = RoundDeadline()
    assert deadline.seconds == FIRST_DEADLINE_S
    deadline.record(0.1)
    assert deadline.seconds == ROUND_DEADLINE_BOUNDS[0]  # 4 x 0.1 + 1 is below the floor
    deadline.record(3.0)
    assert deadline.seconds == pytest.approx(13.0)
    for _ in range(8):  # the slow round leaves the window
        deadline.record(1.0)
    assert deadline.seconds == pytest.approx(5.0)
    deadline.record(1000.0)
    assert deadline.seconds == ROUND_DEADLINE_BOUNDS[1]


def test_a_round_that_cut_a_live_peer_doubles_the_adaptive_deadline_until_fast_rounds_bring_it_down():
    deadline = RoundDeadline()
    deadline.record(0.2)
    assert deadline.seconds == pytest.approx(2.0)  # learnt on an idle machine
    deadline.stretch()
    assert deadline.seconds == pytest.approx(4.0)
    deadline.stretch()
    assert deadline.seconds == pytest.approx(8.0)
    deadline.record(1.5)  # the slower round now fits, and counts with the stretch
    assert deadline.seconds == pytest.approx(8.0)
    for _ in range(8):  # the stretch leaves the window like any slow round
        deadline.record(1.5)
    assert deadline.seconds == pytest.approx(7.0)
    for _ in range(10):
        deadline.stretch()
    assert deadline.seconds == ROUND_DEADLINE_BOUNDS[1]


def test_a_fixed_deadline_is_not_stretched():
    deadline = RoundDeadline(3.0)
    deadline.stretch()
    assert deadline.seconds == 3.0


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_deadline_must_be_positive(bad):
    with pytest.raises(ValueError):
        RoundDeadline(bad)
