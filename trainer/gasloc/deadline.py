"""The round deadline: how long a round's exchange may take before a late peer's edge is dropped.

A job sets it (``round_deadline_s``) or leaves it adaptive: 4 times the
slowest exchange of the last 8 complete rounds (no edge dropped) plus 1 s,
within ``ROUND_DEADLINE_BOUNDS``; a round cut short by a dead peer says
nothing about the live ones, so it is not counted. Until a round has run it
is 20 s, long enough for workers that are still starting.
"""

from __future__ import annotations

from collections import deque

from cantata.proto.jobfields import ROUND_DEADLINE_BOUNDS

FIRST_DEADLINE_S = 20.0
WINDOW = 8
FACTOR = 4.0
SLACK_S = 1.0


class RoundDeadline:
    """Seconds the next round's exchange may take; ``record`` each complete round's exchange time."""

    def __init__(self, fixed_s: float | None = None):
        if fixed_s is not None and not fixed_s > 0:
            raise ValueError(f"a round deadline must be positive, got {fixed_s}")
        self.fixed_s = fixed_s
        self._recent: deque[float] = deque(maxlen=WINDOW)

    @property
    def seconds(self) -> float:
        if self.fixed_s is not None:
            return self.fixed_s
        if not self._recent:
            return FIRST_DEADLINE_S
        low, high = ROUND_DEADLINE_BOUNDS
        return min(high, max(low, FACTOR * max(self._recent) + SLACK_S))

    def record(self, seconds: float) -> None:
        self._recent.append(seconds)
