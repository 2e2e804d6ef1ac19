"""Asynchronous checkpoints: training goes on while a save's sealed objects upload.

:class:`AsyncSaver` runs a save in the three phases of
:class:`~cantata.trainer.checkpoint.TrainingState`: the training thread copies
the state to host memory (the only stall), one background thread seals and
uploads the copies, and the training thread commits the manifest, which is what
makes the checkpoint exist, only once every rank's objects are durable. Every
collective stays on the training thread, in the same order on every rank: the
upload thread only talks to the store.

At most one save is in flight: the next save, a rollback, the job's end and a
stop first finish the one in flight. Between, :meth:`AsyncSaver.poll` commits
it as soon as every rank's upload is done. A failed upload fails closed: no
manifest is written, the checkpoint never becomes visible, and the error is
raised on the training thread as a synchronous save's would be.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from cantata.security.sealed_checkpoint import ShardInfo
from cantata.trainer.checkpoint import Staged, TrainingState


@dataclass(frozen=True)
class Committed:
    """A finished save: its step, its size in the store (on the lead, else None), seconds from start to manifest."""

    step: int
    size: int | None
    seconds: float


@dataclass(frozen=True)
class _InFlight:
    staged: Staged
    began: float
    upload: Future[list[ShardInfo]]


class AsyncSaver:
    """Saves ``state`` with the upload off the training thread, at most one in flight.

    ``all_done(mine)`` is True on every rank once every rank of the committing
    group passed True (a collective, the same answer on every rank).
    """

    def __init__(self, state: TrainingState, all_done: Callable[[bool], bool]):
        self._state, self._all_done = state, all_done
        self._uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-upload")
        self._in_flight: _InFlight | None = None

    @property
    def in_flight(self) -> int | None:
        """The step of the save in flight, or None."""
        return None if self._in_flight is None else self._in_flight.staged.step

    def start(self, step: int) -> Committed | None:
        """Finish the save in flight (returning what it committed), then stage ``step``'s and start its upload."""
        committed = self.finish()
        began = time.perf_counter()
        staged = self._state.stage(step)
        if staged is not None:
            self._in_flight = _InFlight(staged, began, self._uploads.submit(self._state.upload, staged))
        return committed

    def poll(self) -> Committed | None:
        """Commit the save in flight if every rank's upload is done (collective while one is in flight)."""
        if self._in_flight is None or not self._all_done(self._in_flight.upload.done()):
            return None
        return self.finish()

    def finish(self) -> Committed | None:
        """Wait for the upload in flight and commit it (collective); None if none was in flight.

        Raises the upload's error (or :class:`~cantata.trainer.checkpoint.CheckpointUploadError` for another
        rank's) with nothing committed.
        """
        if self._in_flight is None:
            return None
        in_flight, self._in_flight = self._in_flight, None
        try:
            uploaded: list[ShardInfo] | BaseException = in_flight.upload.result()
        except Exception as error:
            uploaded = error
        size = self._state.publish(in_flight.staged, uploaded)
        return Committed(in_flight.staged.step, size, time.perf_counter() - in_flight.began)
