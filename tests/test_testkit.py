"""The test kit's wait: it returns what the predicate returned, or fails at its deadline saying what never came."""

from __future__ import annotations

import itertools

import pytest

from testkit.waiting import NeverHappened, wait_for


def test_wait_for_returns_the_first_true_value_the_predicate_returns() -> None:
    calls = itertools.count()
    assert wait_for(lambda: next(calls) >= 2 and "ready", interval=0.001) == "ready"
    assert next(calls) == 3  # called until it held, then no more


def test_wait_for_fails_at_its_deadline_naming_what_was_awaited() -> None:
    with pytest.raises(NeverHappened, match=r"waited 0\.05 s for the job to start; it did not happen"):
        wait_for(lambda: False, timeout=0.05, what="the job to start", interval=0.001)


def test_wait_for_names_where_its_predicate_is_written_when_not_told() -> None:
    def nothing_arrives() -> bool:
        return False

    with pytest.raises(NeverHappened, match=r"for .*nothing_arrives \(.*test_testkit\.py:\d+\)"):
        wait_for(nothing_arrives, timeout=0.01, interval=0.001)
