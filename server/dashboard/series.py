"""Where the job page's live loss curves and events table come from: one small interface, and its
implementation on job events.

:class:`TrainingSeries` is what the dashboard's event stream reads: the
points stored after a cursor, then each new batch as it is committed, until
the job ends. :class:`EventSeries` answers it from the job's events
(``PROGRESS`` carries the training loss, ``EVAL`` the validation loss, and
every event but a step's progress is a row of the events table) and the
in-memory broadcast, so a browser that follows a job costs the server no
polling; another implementation can read a metrics history instead.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

from cantata.proto.v1 import common_pb2, jobs_pb2
from cantata.proto.vocabulary import is_terminal
from cantata.server.broadcast import EventBroadcast
from cantata.server.dashboard.views import event_row, shown_in_table
from cantata.server.store import Store


@dataclass(frozen=True)
class SeriesUpdate:
    """One thing the page shows: a loss point (``series`` "loss" or "val_loss"), a state change ("state")
    or a row of the events table ("event")."""

    seq: int  # the cursor after this update
    series: str
    step: int = 0
    value: float = 0.0
    state: str = ""
    terminal: bool = False
    row: dict | None = None

    def as_json(self) -> dict:
        if self.series == "state":
            return {"seq": self.seq, "state": self.state, "terminal": self.terminal}
        if self.series == "event":
            return {"seq": self.seq, "event": self.row}
        value = self.value if math.isfinite(self.value) else None  # a diverged run's NaN is a gap in the curve
        return {"seq": self.seq, "series": self.series, "step": self.step, "value": value}


class TrainingSeries(Protocol):
    """A job's loss curves: what is stored after ``cursor``, then live batches, ending with the job."""

    def follow(self, job_id: str, cursor: int) -> AsyncGenerator[list[SeriesUpdate]]: ...


def _updates(event: jobs_pb2.JobEvent, *, terminal: bool) -> list[SeriesUpdate]:
    updates = []
    if event.kind == jobs_pb2.PROGRESS:
        updates.append(SeriesUpdate(event.seq, "loss", event.step, event.loss))
    elif event.kind == jobs_pb2.EVAL:
        updates.append(SeriesUpdate(event.seq, "val_loss", event.step, event.val_loss))
    elif event.kind == jobs_pb2.STATE:
        updates.append(SeriesUpdate(event.seq, "state", state=common_pb2.JobState.Name(event.state), terminal=terminal))
    if shown_in_table(event):
        updates.append(SeriesUpdate(event.seq, "event", row=event_row(event)))
    return updates


class EventSeries:
    """:class:`TrainingSeries` on the store's events and the broadcast (run on the broadcast's event loop)."""

    def __init__(self, store: Store, broadcast: EventBroadcast):
        self._store = store
        self._broadcast = broadcast

    def _has_ended(self, job_id: str) -> bool:
        return is_terminal(self._store.jobs.get(job_id).state)

    async def follow(self, job_id: str, cursor: int) -> AsyncGenerator[list[SeriesUpdate]]:
        """Batches of updates after ``cursor``; the last batch holds the job's (latest) end."""
        with self._broadcast.subscribe(job_id) as live:  # before reading the store, so nothing falls between
            catching_up = True
            while True:
                from_store = catching_up
                if catching_up:
                    events = await asyncio.to_thread(self._store.events_after, job_id, cursor)
                    catching_up = bool(events)
                    if not events and await asyncio.to_thread(self._has_ended, job_id):
                        return  # a browser reconnecting after the end already holds it: nothing will follow
                else:
                    events = await live.next_batch()
                    if live.overflowed:
                        live.overflowed, catching_up = False, True
                        continue
                batch: list[SeriesUpdate] = []
                ended = False
                for index, event in enumerate(events):
                    if event.seq <= cursor:
                        continue
                    cursor = event.seq
                    terminal = event.terminal and not (
                        await asyncio.to_thread(self._store.resumed_after, job_id, event.seq)
                        if from_store
                        else any(later.kind == jobs_pb2.STATE for later in events[index + 1 :])
                    )
                    batch.extend(_updates(event, terminal=terminal))
                    if terminal:
                        ended = True
                        break
                if batch:
                    yield batch
                if ended:
                    return
