"""Sending the numbered parts of one upload (S3 parts, Azure blocks), several at a time.

:class:`PartSender` keeps at most ``concurrency`` parts in flight on a small
thread pool, so one upload's memory stays bounded (``concurrency`` parts)
while its network round trips overlap; with ``concurrency`` 1 it sends each
part in the caller's thread, as a plain loop would. The first failure is
raised by the next call, and the upload's owner aborts it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

T = TypeVar("T")


class PartSender(Generic[T]):
    """``submit`` parts (numbered from 1), then ``results`` in part order; ``cancel`` on failure."""

    def __init__(self, send: Callable[[int, bytes], T], concurrency: int, name: str = "part"):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._send = send
        self._concurrency = concurrency
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix=name) if concurrency > 1 else None
        self._pending: dict[int, Future[T]] = {}
        self._done: dict[int, T] = {}
        self.count = 0  # parts submitted

    def submit(self, part: bytes) -> None:
        """Send the next part; blocks while ``concurrency`` parts are in flight; raises an earlier failure."""
        self.count += 1
        if self._pool is None:
            self._done[self.count] = self._send(self.count, part)
            return
        self._collect(block=len(self._pending) >= self._concurrency)
        self._pending[self.count] = self._pool.submit(self._send, self.count, part)

    def results(self) -> list[T]:
        """Every part's result in part order, once all are sent; raises the first failure."""
        while self._pending:
            self._collect(block=True)
        self._shutdown()
        return [self._done[n] for n in sorted(self._done)]

    def cancel(self) -> None:
        """Stop: parts not started are dropped, those in flight are waited for, failures ignored."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._shutdown()

    def _collect(self, *, block: bool) -> None:
        if block:
            wait(self._pending.values(), return_when=FIRST_COMPLETED)
        for number, future in list(self._pending.items()):
            if future.done():
                del self._pending[number]
                self._done[number] = future.result()  # raises the part's failure

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
