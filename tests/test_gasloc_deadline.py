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


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_deadline_must_be_positive(bad):
    with pytest.raises(ValueError):
        RoundDeadline(bad)
