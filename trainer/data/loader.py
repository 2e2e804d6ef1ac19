"""The streaming loader: deterministic, prefetching, exactly resumable.

Windows. An object of ``n`` tokens holds ``(n - 1) // seq_len`` windows of
``seq_len + 1`` tokens (input and shifted target), window ``j`` starting at
token ``j * seq_len``. The last ``val_fraction`` of each object's windows
(at least one, when it has two or more) form the validation split; the rest
are for training, so the two never overlap and neither depends on the
number of workers.

Order. In epoch ``e`` the objects are permuted by a generator seeded with
``(seed, e)`` and data-parallel rank ``r`` of ``world`` takes every
``world``-th object from position ``r``: the ranks' objects, and therefore
their windows, are disjoint within an epoch. Inside an object the training
windows are permuted by a generator seeded with ``(seed, e, object)``. A
rank moves to its next epoch when its objects run out. Ranks that hold
replicas of the same data (tensor-parallel peers) pass the same ``rank``.

Prefetch. A pool of ``fetchers`` threads fetches, verifies (and decrypts,
tokenizes) the next ``prefetch`` objects of the stream while the trainer
trains, so memory is bounded by ``prefetch + 1`` objects; the trainer's
thread only gathers windows. Time it spends blocked on an object still in
flight is counted in :attr:`DataLoader.wait_seconds`.

Batches. The trainer's thread gathers windows, widened to int64, straight
into one buffer, whole batches of ~``STAGE_TOKENS`` tokens of an object at a
time; a batch is a slice of that buffer (inputs and targets are two views of
its rows), so small batches cost a few slices rather than a gather each.

Resume. :meth:`DataLoader.state_dict` is the position after the last batch
returned, ``(epoch, object, window)``; :meth:`DataLoader.load_state_dict`
restores it, and the next batch is exactly the one that would have followed.
Each batch carries ``sample_ids`` (``object << 32 | window``) that prove it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from cantata.trainer.data.batch import Batch
from cantata.trainer.data.errors import DataError
from cantata.trainer.data.sources import Dataset

DEFAULT_VAL_FRACTION = 0.05
DEFAULT_PREFETCH = 4
DEFAULT_FETCHERS = 2
PROGRESS_INTERVAL_S = 5.0
STAGE_TOKENS = 1 << 16  # small batches are gathered about this many int64 tokens (512 KiB) at a time
STATE_VERSION = 1


@dataclass(frozen=True)
class DataEvent:
    """Something a job's owner should see: ``progress`` of a first pass, or a ``warning``."""

    kind: str
    message: str


def window_split(tokens: int, seq_len: int, val_fraction: float) -> tuple[int, int]:
    """(training windows, validation windows) of an object of ``tokens`` tokens."""
    windows = max(0, (tokens - 1) // seq_len)
    val = min(windows - 1, math.ceil(windows * val_fraction)) if windows >= 2 else 0
    return windows - val, val


def _windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """The read-only view whose row ``w`` is ``tokens[w * seq_len : w * seq_len + seq_len + 1]`` (no copy)."""
    count = max(0, (tokens.size - 1) // seq_len)
    return np.lib.stride_tricks.as_strided(
        tokens, shape=(count, seq_len + 1), strides=(seq_len * tokens.itemsize, tokens.itemsize), writeable=False
    )


def _batch(rows: np.ndarray, ids: np.ndarray) -> Batch:
    """The batch of int64 ``rows`` of ``seq_len + 1`` tokens: inputs and targets are views of them."""
    return Batch(torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:]), torch.from_numpy(ids))


@dataclass
class _Fetched:
    epoch: int
    position: int  # index in this rank's object order for the epoch
    ordinal: int  # index in the dataset's object list
    windows: np.ndarray  # (windows, seq_len + 1) view of the object's tokens
    order: np.ndarray  # training windows, in this epoch's order
    ids: np.ndarray  # their sample ids
    taken: int = 0  # windows handed out
    staged_from: int = 0  # windows [staged_from, staged_from + len(staged)) are gathered into ``staged``
    staged: np.ndarray = field(default_factory=lambda: np.empty((0, 0), dtype=np.int64))
    staged_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


@dataclass(frozen=True)
class _Slot:
    """Where an object sits in this rank's stream."""

    epoch: int
    position: int
    ordinal: int
    last_of_epoch: bool


class DataLoader:
    """Training batches for one data-parallel rank, streamed from a :class:`Dataset`.

    ``on_event`` receives progress events from the trainer's thread and
    warnings (skipped text) from fetcher threads, so it must be thread-safe.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        seq_len: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        val_fraction: float = DEFAULT_VAL_FRACTION,
        prefetch: int = DEFAULT_PREFETCH,
        fetchers: int = DEFAULT_FETCHERS,
        on_event: Callable[[DataEvent], None] | None = None,
    ) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if len(dataset.objects) < world:
            raise DataError(
                f"dataset {dataset.uri} has {len(dataset.objects)} objects, fewer than the {world} "
                "data-parallel ranks that must each read their own (prepare smaller shards)"
            )
        self.dataset = dataset
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.rank, self.world, self.val_fraction = rank, world, val_fraction
        self._prefetch, self._fetchers = max(1, prefetch), max(1, fetchers)
        self._on_event = on_event or (lambda event: None)
        self._epoch, self._position, self._window = 0, 0, 0
        self._current: _Fetched | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._slots: Iterator[_Slot] = iter(())
        self._pending: deque[tuple[_Slot, Future]] = deque()
        self._windows_in_epoch = 0
        self._last_report = 0.0
        self.wait_seconds = 0.0  # time the trainer spent blocked on data
        self.samples = 0

    # ---- order ---------------------------------------------------------
    def objects_of_epoch(self, epoch: int) -> np.ndarray:
        """The dataset ordinals this rank reads in ``epoch``, in order."""
        permutation = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(len(self.dataset.objects))
        return permutation[self.rank :: self.world]

    def _stream(self, epoch: int, position: int) -> Iterator[_Slot]:
        while True:
            ordinals = self.objects_of_epoch(epoch)
            for index in range(position, len(ordinals)):
                yield _Slot(epoch, index, int(ordinals[index]), index + 1 == len(ordinals))
            epoch, position = epoch + 1, 0

    # ---- prefetch ------------------------------------------------------
    def _load(self, slot: _Slot) -> _Fetched:
        """Runs on a fetcher thread: fetch, verify (decrypt, tokenize) and order one object's windows."""
        tokens = self.dataset.tokens(self.dataset.objects[slot.ordinal], self._warn)
        train, _ = window_split(tokens.size, self.seq_len, self.val_fraction)
        generator = np.random.Generator(np.random.PCG64([self.seed, slot.epoch, slot.ordinal]))
        order = generator.permutation(train)
        return _Fetched(
            slot.epoch, slot.position, slot.ordinal, _windows(tokens, self.seq_len), order, order | (slot.ordinal << 32)
        )

    def _warn(self, message: str) -> None:
        self._on_event(DataEvent("warning", message))

    def _top_up(self) -> None:
        assert self._pool is not None
        while len(self._pending) < self._prefetch:
            slot = next(self._slots)
            self._pending.append((slot, self._pool.submit(self._load, slot)))

    def _next_object(self) -> _Fetched:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._fetchers, thread_name_prefix=f"data-fetch-{self.rank}")
            self._slots = self._stream(self._epoch, self._position)
            self._windows_in_epoch = self._window
        self._top_up()
        slot, future = self._pending.popleft()
        started = time.perf_counter()
        item = future.result()
        self.wait_seconds += time.perf_counter() - started
        self._top_up()
        if (item.epoch, item.position) == (self._epoch, self._position):
            item.taken = self._window  # resuming inside this object
        self._account(slot, item)
        return item

    def _account(self, slot: _Slot, item: _Fetched) -> None:
        """Progress events over the first pass; refuse an epoch without a single window."""
        self._windows_in_epoch += item.order.size
        if slot.epoch == 0:
            now = time.monotonic()
            if slot.last_of_epoch or now - self._last_report >= PROGRESS_INTERVAL_S:
                total = len(self.dataset.objects[self.rank :: self.world])
                self._on_event(
                    DataEvent(
                        "progress",
                        f"{self.dataset.uri}: fetched {slot.position + 1}/{total} objects of rank {self.rank}",
                    )
                )
                self._last_report = now
        if slot.last_of_epoch:
            if self._windows_in_epoch == 0:
                raise self._empty_epoch()
            self._windows_in_epoch = 0

    def _empty_epoch(self) -> DataError:
        return DataError(
            f"dataset {self.dataset.uri}: rank {self.rank}'s objects hold no training window of "
            f"{self.seq_len + 1} tokens"
        )

    # ---- batches -------------------------------------------------------
    def next_batch(self) -> Batch:
        """The next batch: a slice of the whole batches staged from the current object, else gathered afresh."""
        current, size = self._current, self.batch_size
        if current is not None and current.taken + size <= current.order.size:
            at = current.taken - current.staged_from
            if at + size > len(current.staged):
                self._stage(current)
                at = 0
            current.taken += size
            self._window = current.taken
            self.samples += size
            return _batch(current.staged[at : at + size], current.staged_ids[at : at + size])
        return self._gathered_batch()

    def _stage(self, current: _Fetched) -> None:
        """Gather (widening to int64) the next whole batches of ``current``, about STAGE_TOKENS tokens, at once."""
        batches = max(1, STAGE_TOKENS // (self.batch_size * (self.seq_len + 1)))
        start = current.taken
        stop = start + min(batches, (current.order.size - start) // self.batch_size) * self.batch_size
        staged = np.empty((stop - start, self.seq_len + 1), dtype=np.int64)
        staged[:] = current.windows[current.order[start:stop]]
        current.staged_from, current.staged, current.staged_ids = start, staged, current.ids[start:stop].copy()

    def _gathered_batch(self) -> Batch:
        """A batch gathered into its own buffer, across objects when the current one runs out."""
        rows = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int64)
        ids = np.empty(self.batch_size, dtype=np.int64)
        filled = 0
        while filled < self.batch_size:
            current = self._current
            if current is None or current.taken == current.order.size:
                current = self._current = self._next_object()
                continue
            start = current.taken
            stop = min(current.order.size, start + self.batch_size - filled)
            end = filled + stop - start
            rows[filled:end] = current.windows[current.order[start:stop]]
            ids[filled:end] = current.ids[start:stop]
            current.taken, filled = stop, end
            self._epoch, self._position, self._window = current.epoch, current.position, stop
        self.samples += self.batch_size
        return _batch(rows, ids)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    # ---- resume --------------------------------------------------------
    def state_dict(self) -> dict[str, int | str]:
        """The position after the last batch returned (plain values: fits any checkpoint)."""
        return {
            "version": STATE_VERSION,
            "dataset": self.dataset.uri,
            "seed": self.seed,
            "rank": self.rank,
            "world": self.world,
            "seq_len": self.seq_len,
            "epoch": self._epoch,
            "object": self._position,
            "window": self._window,
            "samples": self.samples,
        }

    def seek(self, batches: int) -> None:
        """Continue as if ``batches`` batches had been drawn from the start (fetches objects to count windows).

        For a worker that holds no saved position, such as a decentralized
        worker rejoining at a later round: its position is a function of how
        many batches it would have drawn.
        """
        self.close()
        remaining = batches * self.batch_size
        windows_in_epoch = 0
        for slot in self._stream(0, 0):
            tokens = self.dataset.tokens(self.dataset.objects[slot.ordinal], self._warn)
            windows = window_split(tokens.size, self.seq_len, self.val_fraction)[0]
            if remaining <= windows:
                self._epoch, self._position, self._window = slot.epoch, slot.position, remaining
                break
            remaining -= windows
            windows_in_epoch += windows
            if slot.last_of_epoch:
                if windows_in_epoch == 0:
                    raise self._empty_epoch()
                windows_in_epoch = 0
        self.samples = batches * self.batch_size

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next batch is the one that followed it."""
        expected = {
            "version": STATE_VERSION,
            "dataset": self.dataset.uri,
            "seed": self.seed,
            "rank": self.rank,
            "world": self.world,
            "seq_len": self.seq_len,
        }
        mismatched = [f"{k}={state.get(k)!r} (now {v!r})" for k, v in expected.items() if state.get(k) != v]
        if mismatched:
            raise DataError("cannot resume the data loader from a state of another run: " + ", ".join(mismatched))
        self.close()
        self._epoch, self._position, self._window = int(state["epoch"]), int(state["object"]), int(state["window"])
        self.samples = int(state["samples"])

    def close(self) -> None:
        """Stop prefetching (it restarts on the next batch)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()
        self._current = None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ValidationSet:
    """The validation windows of a dataset, in object order: the same batches on every rank."""

    def __init__(
        self, dataset: Dataset, *, batch_size: int, seq_len: int, val_fraction: float = DEFAULT_VAL_FRACTION
    ) -> None:
        self.dataset, self.batch_size, self.seq_len, self.val_fraction = dataset, batch_size, seq_len, val_fraction
        self._batches: list[Batch] = []

    def check_capacity(self, count: int) -> None:
        """Raise the error :meth:`batches` would, when the objects' listed sizes alone show it (nothing is fetched)."""
        bound = sum(
            window_split(self.dataset.max_tokens(obj), self.seq_len, self.val_fraction)[1]
            for obj in self.dataset.objects
        )
        if bound < count * self.batch_size:
            raise self._too_small(f"at most {bound}", count)

    def _too_small(self, windows: str, count: int) -> DataError:
        return DataError(
            f"dataset {self.dataset.uri} is too small for the job's validation: it holds {windows} validation "
            f"windows of {self.seq_len + 1} tokens (the last {self.val_fraction:.0%} of each object), and "
            f"eval_batches={count} x batch_size={self.batch_size} needs {count * self.batch_size}; add data, or "
            "lower eval_batches, batch_size or seq_len"
        )

    def batches(self, count: int, on_warning: Callable[[str], None] = lambda message: None) -> list[Batch]:
        """The first ``count`` validation batches (read once, then kept)."""
        if len(self._batches) >= count:
            return self._batches[:count]
        total = count * self.batch_size
        rows = np.empty((total, self.seq_len + 1), dtype=np.int64)
        ids = np.empty(total, dtype=np.int64)
        filled = 0
        for ordinal, obj in enumerate(self.dataset.objects):
            tokens = self.dataset.tokens(obj, on_warning)
            train, val = window_split(tokens.size, self.seq_len, self.val_fraction)
            chosen = np.arange(train, train + min(val, total - filled))
            end = filled + chosen.size
            rows[filled:end] = _windows(tokens, self.seq_len)[chosen]
            ids[filled:end] = (ordinal << 32) | chosen
            filled = end
            if filled == total:
                break
        if filled < total:
            raise self._too_small(str(filled), count)
        self._batches = [
            _batch(rows[i : i + self.batch_size], ids[i : i + self.batch_size])
            for i in range(0, total, self.batch_size)
        ]
        return self._batches
