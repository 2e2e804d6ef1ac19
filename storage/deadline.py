"""A time budget for retries, where a client library can only count attempts.

botocore retries a request a fixed number of times; :func:`within` repeats a
whole call (each one with botocore's own retries) while it fails with
:class:`StoreUnavailableError` and its budget lasts, so an outage shorter than
the budget is survived and a longer one fails after about the budget. A
``watch`` hears of each failure that will be retried and of each answer, so
that someone learns of the outage while it lasts (:mod:`cantata.storage.outage`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from cantata.storage.base import StoreUnavailableError
from cantata.storage.outage import OutageWatch

T = TypeVar("T")

FIRST_PAUSE = 0.5
MAX_PAUSE = 4.0


def within(budget: float, call: Callable[[], T], watch: OutageWatch | None = None) -> T:
    """Return ``call()``, calling it again after a growing pause while it is unavailable and ``budget`` seconds last."""
    deadline = time.monotonic() + budget
    pause = FIRST_PAUSE
    while True:
        try:
            result = call()
        except StoreUnavailableError as error:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreUnavailableError(f"{error} (still failing after {budget:g} s of retries)") from error
            if watch is not None:
                watch.failed(str(error))
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, MAX_PAUSE)
        else:
            if watch is not None:
                watch.answered()
            return result
