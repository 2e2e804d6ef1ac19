"""Each job's new events, pushed to its open watchers: nobody polls the store for them.

The store publishes a job's events once the transaction that wrote them has
committed, from whatever thread committed it; :class:`EventBroadcast` hands
them to the server's event loop in one callback, which serializes each event
once and appends it, with its bytes, to every subscription of that job and wakes
its watcher (which sends the shared bytes as they are). A watcher subscribes before it
reads what the store already has, so no event falls between the two (one seen
twice is skipped by its sequence number). A subscription that falls
``backlog`` events behind is marked ``overflowed`` and emptied: its watcher
reads the store from its cursor again, so a slow client costs the server a
bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from cantata.proto.v1 import jobs_pb2

DEFAULT_BACKLOG = 1000  # events a subscription holds before its watcher must re-read the store


class Subscription:
    """One watcher's queue of a job's events, each with its wire bytes (used on the event loop only)."""

    def __init__(self, backlog: int):
        self._backlog = backlog
        self._events: deque[tuple[jobs_pb2.JobEvent, bytes]] = deque()
        self._ready = asyncio.Event()
        self.overflowed = False

    def _deliver(self, events: Sequence[tuple[jobs_pb2.JobEvent, bytes]]) -> None:
        if len(self._events) + len(events) > self._backlog:
            self._events.clear()
            self.overflowed = True
        else:
            self._events.extend(events)
        self._ready.set()

    async def next_encoded(self) -> list[tuple[jobs_pb2.JobEvent, bytes]]:
        """Wait until something was delivered; return it, each event with its serialized bytes, which every
        watcher shares (empty after an overflow, which stays flagged)."""
        await self._ready.wait()
        self._ready.clear()
        batch = list(self._events)
        self._events.clear()
        return batch

    async def next_batch(self) -> list[jobs_pb2.JobEvent]:
        """As :meth:`next_encoded`, the events alone."""
        return [event for event, _ in await self.next_encoded()]


class EventBroadcast:
    """Job id → its watchers' subscriptions, fed from any thread, consumed on one event loop."""

    def __init__(self, backlog: int = DEFAULT_BACKLOG):
        self._backlog = backlog
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._lock = threading.Lock()  # guards the map; delivery itself runs on the loop

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver on ``loop`` from now on (the server's); until then publishing is a no-op."""
        self._loop = loop

    def publish(self, job_id: str, events: Sequence[jobs_pb2.JobEvent]) -> None:
        """Hand committed events to the job's watchers; cheap when it has none. Thread-safe."""
        loop = self._loop
        if loop is None or not events or job_id not in self._subscriptions:
            return
        try:
            loop.call_soon_threadsafe(self._deliver, job_id, tuple(events))
        except RuntimeError:  # the loop has closed: the server is stopping and no watcher is left
            return

    def _deliver(self, job_id: str, events: tuple[jobs_pb2.JobEvent, ...]) -> None:
        with self._lock:
            subscriptions = tuple(self._subscriptions.get(job_id, ()))
        encoded = tuple((event, event.SerializeToString()) for event in events)  # once, for every watcher
        for subscription in subscriptions:
            subscription._deliver(encoded)

    @contextmanager
    def subscribe(self, job_id: str) -> Iterator[Subscription]:
        """A subscription to ``job_id``'s events, for the life of the block (on the event loop)."""
        subscription = Subscription(self._backlog)
        with self._lock:
            self._subscriptions.setdefault(job_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            with self._lock:
                watchers = self._subscriptions.get(job_id)
                if watchers is not None:
                    watchers.discard(subscription)
                    if not watchers:
                        del self._subscriptions[job_id]

    def watchers(self, job_id: str) -> int:
        """How many subscriptions ``job_id`` has now."""
        with self._lock:
            return len(self._subscriptions.get(job_id, ()))
