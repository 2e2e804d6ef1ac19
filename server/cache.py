"""Answers kept in memory until what they were read from changes (:meth:`Cache.clear`, from a commit hook)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Cache(Generic[K, V]):
    """Answers kept in memory until :meth:`clear`; a load that raced a clear is not kept.

    At most ``limit`` answers are kept: past it, the oldest goes.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self._values: dict[K, V] = {}
        self._limit = limit
        self._generation = 0
        self._lock = threading.Lock()

    def get(self, key: K, load: Callable[[K], V]) -> V:
        with self._lock:
            if key in self._values:
                return self._values[key]
            generation = self._generation
        value = load(key)
        with self._lock:
            if generation == self._generation:
                if len(self._values) >= self._limit:
                    del self._values[next(iter(self._values))]
                self._values[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._generation += 1
