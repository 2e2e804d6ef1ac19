"""Say once when a store becomes unreachable, and once when it answers again.

A store's retries report each failed attempt and each answer to its
:class:`OutageWatch`: the :class:`OutageListener` (the caller's hook, say a
worker that reports it to the control plane) hears of an outage at its first
failed attempt, with the cause and how long the store will keep retrying, and
of its end at the first answer after it, never once per retry. An outage
that outlasts the budget ends in :class:`~cantata.storage.base.StoreUnavailableError`
as before; the listener hears of no end then.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class OutageListener(Protocol):
    """Who hears that a store (named by its URI) stopped answering, and that it answers again."""

    def unreachable(self, store: str, cause: str, retry_for: float) -> None: ...

    def reachable(self, store: str, seconds: float) -> None: ...


class OutageWatch:
    """One store's outage state across its calls and threads; tells ``listener`` of each change."""

    def __init__(self, store: str, retry_for: float, listener: OutageListener | None) -> None:
        self._store = store
        self._retry_for = retry_for
        self._listener = listener
        self._since: float | None = None  # when the current outage began
        self._lock = threading.Lock()  # held while the listener hears, so it hears the changes in order

    def failed(self, cause: str) -> None:
        """An attempt failed transiently and will be retried: the outage begins, unless it already has."""
        with self._lock:
            if self._since is not None:
                return
            self._since = time.monotonic()
            if self._listener is not None:
                self._listener.unreachable(self._store, cause, self._retry_for)

    def answered(self) -> None:
        """The store answered: an outage under way is over."""
        if self._since is None:
            return
        with self._lock:
            since, self._since = self._since, None
            if since is not None and self._listener is not None:
                self._listener.reachable(self._store, time.monotonic() - since)
