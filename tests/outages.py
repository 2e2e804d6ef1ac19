"""An outage listener that records what a store tells it, for tests to wait on (no sleeps)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

WAIT_SECONDS = 120.0  # a bound for a loaded machine, not a timing assertion


@dataclass(frozen=True)
class Heard:
    what: Literal["unreachable", "reachable"]
    store: str
    cause: str = ""
    retry_for: float = 0.0
    seconds: float = 0.0


class HeardOutages:
    """:class:`cantata.storage.outage.OutageListener` that keeps every call in order."""

    def __init__(self) -> None:
        self.events: list[Heard] = []
        self._changed = threading.Condition()

    def unreachable(self, store: str, cause: str, retry_for: float) -> None:
        self._add(Heard("unreachable", store, cause=cause, retry_for=retry_for))

    def reachable(self, store: str, seconds: float) -> None:
        self._add(Heard("reachable", store, seconds=seconds))

    def _add(self, heard: Heard) -> None:
        with self._changed:
            self.events.append(heard)
            self._changed.notify_all()

    def wait_for(self, what: str) -> Heard:
        """The first event of kind ``what``, once it has come."""
        with self._changed:
            came = self._changed.wait_for(lambda: any(e.what == what for e in self.events), WAIT_SECONDS)
            assert came, f"no {what!r} outage event in {WAIT_SECONDS:g} s: {self.events}"
            return next(e for e in self.events if e.what == what)
