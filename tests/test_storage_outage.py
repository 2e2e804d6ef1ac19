"""The retry wrapper tells an outage once when it begins and once when it ends, across calls and retries.

The calls are scripted functions (what fails is the wrapper's input, not a
service); the stores' own retries under real faults are in test_storage_faults.
"""

from __future__ import annotations

import pytest

from cantata.storage import deadline
from cantata.storage.base import StoreUnavailableError
from cantata.storage.deadline import within
from cantata.storage.outage import OutageWatch
from tests.outages import HeardOutages

STORE = "s3://bucket/prefix/"


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadline, "FIRST_PAUSE", 0.01)
    monkeypatch.setattr(deadline, "MAX_PAUSE", 0.01)


def failing(times: int, result: str = "ok"):
    """A call that is unavailable ``times`` times, then returns ``result``."""
    left = [times]

    def call() -> str:
        if left[0]:
            left[0] -= 1
            raise StoreUnavailableError(f"S3 unreachable (attempt failed, {left[0]} to go)")
        return result

    return call


def test_one_outage_over_many_retries_and_calls_is_told_once_each_way() -> None:
    heard = HeardOutages()
    watch = OutageWatch(STORE, 60.0, heard)
    assert within(60.0, failing(0), watch) == "ok"
    assert heard.events == []
    assert within(60.0, failing(3), watch) == "ok"
    assert within(60.0, failing(2), watch) == "ok"  # a second outage, after the first ended
    assert [(e.what, e.store) for e in heard.events] == [
        ("unreachable", STORE),
        ("reachable", STORE),
        ("unreachable", STORE),
        ("reachable", STORE),
    ]
    assert heard.events[0].cause == "S3 unreachable (attempt failed, 2 to go)"  # the first failure's cause
    assert heard.events[0].retry_for == 60.0


def test_an_outage_still_failing_after_the_budget_raises_and_tells_no_end() -> None:
    heard = HeardOutages()
    with pytest.raises(StoreUnavailableError, match=r"still failing after 0\.05 s of retries"):
        within(0.05, failing(1_000_000), OutageWatch(STORE, 0.05, heard))
    assert [e.what for e in heard.events] == ["unreachable"]


def test_a_call_with_no_budget_fails_at_once_and_tells_nothing() -> None:
    heard = HeardOutages()
    with pytest.raises(StoreUnavailableError):
        within(0.0, failing(1), OutageWatch(STORE, 0.0, heard))
    assert heard.events == []
