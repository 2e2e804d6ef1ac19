"""A server task on a thread of its own: ``tick`` every ``interval`` seconds until shut down.

A tick that raises is logged with its traceback and the next one runs as
planned, so a store that is slow or down delays only that task.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

log = logging.getLogger(__name__)


class PeriodicTask(ABC):
    """Calls ``tick`` every ``interval`` seconds (first at start when ``at_start``); subclasses define ``tick``."""

    def __init__(self, name: str, interval: float, *, at_start: bool):
        self._name = name
        self._interval = interval
        self._at_start = at_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abstractmethod
    def tick(self) -> object:
        """One round of the task's work."""

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, wait: float = 5.0) -> None:
        """Stop; a tick in progress (a store retrying) is not waited for past ``wait`` seconds."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(wait)

    def _run(self) -> None:
        if not self._at_start and self._stop.wait(self._interval):
            return
        while True:
            try:
                self.tick()
            except Exception:  # run again later; the error is logged with its traceback
                log.exception("%s failed", self._name)
            if self._stop.wait(self._interval):
                return
