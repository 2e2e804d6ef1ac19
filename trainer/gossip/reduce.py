"""DiLoCo's all-reduce over one bidirectional stream per pair of workers, pipelined in chunks.

Each member owns a contiguous share of the vector (a direct reduce-scatter,
then an all-gather): every worker streams each peer its values over that
peer's share (step ``CONTRIBUTE``); an owner sums a chunk of its share as soon
as every peer's values for it are in, in member order (so the sum does not
depend on arrival order), and streams the summed chunk to every peer at once
(step ``SUMMED``). Each worker sends ``2 (n - 1) / n`` of the vector, as a ring
does, but in two hops instead of ``2 (n - 1)`` swaps; with chunks pipelined a
round costs about that traffic over the worker's link plus a few round trips.
Small vectors (``GATHER_BYTES``), and ``n = 2`` where it sends no more, skip
the second hop: every worker streams its whole vector to every peer and sums
all of them itself, in member order.

A worker that holds everything it needs from a peer, and has sent it
everything, sends it an empty chunk of step ``DONE``. The all-reduce returns
once its sum is complete and every peer said DONE or closed its stream, so a
worker that exits right after its last all-reduce leaves its peers nothing
missing.

Sums stay in the vector's dtype; chunks may travel as ``wire_dtype``, and every
worker still ends with the same bits: an owner rounds its summed share to the
wire dtype, and a gathering worker sums its own vector as its peers see it.

Any failure (a refused, reset or corrupt link, a member gone, the deadline)
fails the whole all-reduce closed: ``AllReduceFailed``, never a partial sum.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
from xxhash import xxh3_64_intdigest

from .allreduce import AllReduceFailed
from .bandwidth import TokenBucket
from .chunks import CorruptPayload, dtype_name
from .wire import Chunk

CONTRIBUTE, SUMMED, DONE = 0, 1, 2
GATHER_BYTES = 64 << 10  # vectors up to this size on the wire take one hop: every worker sums everything
POLL_S = 0.25  # how often a waiting all-reduce asks ``gone()`` which members will not come

Range = tuple[int, int]


class Reduced(NamedTuple):
    total: torch.Tensor  # the sum over every member
    traffic: dict[int, tuple[int, int]]  # peer -> (payload bytes sent to it, received from it)


def chunk_ranges(start: int, end: int, per: int) -> list[Range]:
    """``[start, end)`` cut into element ranges of at most ``per`` (one empty range if it is empty)."""
    return [(a, min(end, a + per)) for a in range(start, end, per)] or [(start, end)]


class Plan:
    """Who sums which share of a vector of ``length`` elements, in chunks of at most ``per`` elements."""

    def __init__(self, members: Sequence[int], length: int, wire_bytes: int, chunk_bytes: int):
        self.members = tuple(members)
        self.length = length
        self.gather = len(self.members) <= 2 or length * wire_bytes <= GATHER_BYTES
        self.per = max(1, chunk_bytes // wire_bytes)

    def share(self, member: int) -> Range:
        if self.gather:
            return 0, self.length
        n, k = len(self.members), self.members.index(member)
        return k * self.length // n, (k + 1) * self.length // n

    def chunks(self, member: int) -> list[Range]:
        return chunk_ranges(*self.share(member), self.per)


class Reduction:
    """One worker's side of one all-reduce: what it streams each peer, what it took in, and its sum.

    Link threads call ``take`` with every chunk a peer sent and ``closed``
    when the peer's stream ends; ``outgoing`` is what to stream to a peer;
    ``wait`` returns the sum.
    """

    def __init__(
        self,
        round: int,
        vector: torch.Tensor,
        members: Sequence[int],
        me: int,
        wire_dtype: torch.dtype | None,
        chunk_bytes: int,
        deadline: float,
    ):
        flat = vector.detach().reshape(-1).contiguous().cpu()
        wire = wire_dtype or flat.dtype
        self.round, self.me, self.deadline = round, me, deadline
        self.peers = tuple(m for m in members if m != me)
        self.plan = Plan(members, flat.numel(), wire.itemsize, chunk_bytes)
        self._dtype_name = dtype_name(wire)
        self._sent_wire = flat.to(wire, copy=True)  # this worker's vector as its peers get it
        self._own = self._sent_wire.to(flat.dtype) if self.plan.gather else flat
        self.total = torch.empty_like(flat)
        self._lo, hi = self.plan.share(me)
        self._mine = self.plan.chunks(me)
        self._taken = {p: torch.empty(hi - self._lo, dtype=wire) for p in self.peers}  # their values, my share
        self._summed_wire = torch.empty(hi - self._lo, dtype=wire)  # my share summed, as sent
        self._gathered = torch.empty(0 if self.plan.gather else flat.numel(), dtype=wire)  # their summed shares
        self._expected = {
            (p, step): len(ranges)
            for p in self.peers
            for step, ranges in ((CONTRIBUTE, self._mine), (SUMMED, [] if self.plan.gather else self.plan.chunks(p)))
        }
        self._seen: dict[tuple[int, int], set[int]] = {key: set() for key in self._expected}
        self._arrived = [0] * len(self._mine)
        self._summed = 0
        self._finished: set[int] = set()  # peers sent everything, DONE included
        self._settled: set[int] = set()  # peers that said DONE or whose stream ended after all they owed
        self._failure = ""
        self._on_fail: list[Callable[[], object]] = []
        self._cond = threading.Condition()
        self._queues: dict[int, queue.SimpleQueue[Chunk | None]] = {p: queue.SimpleQueue() for p in self.peers}
        self._traffic = {p: [0, 0] for p in self.peers}
        for p in self.peers:
            for k, (a, b) in enumerate(self.plan.chunks(p)):
                self._queues[p].put(self._chunk(CONTRIBUTE, k, len(self.plan.chunks(p)), self._sent_wire[a:b]))
        for k in range(len(self._mine)) if not self.peers else ():
            self._sum(k)

    @property
    def failure(self) -> str:
        return self._failure

    def _chunk(self, step: int, index: int, count: int, data: torch.Tensor) -> Chunk:
        raw = data.view(torch.uint8).numpy().data if data.numel() else memoryview(b"")
        size = data.numel() * data.element_size()
        return Chunk(self.round, self.me, index, count, size, self._dtype_name, xxh3_64_intdigest(raw), raw, step=step)

    def outgoing(self, peer: int, bucket: TokenBucket | None = None) -> Iterator[Chunk]:
        """The chunks for ``peer``, as they become ready, paced by ``bucket``; ends after DONE or on failure."""
        chunks = self._queues[peer]
        while (chunk := chunks.get()) is not None:
            if bucket is not None:
                bucket.take(len(chunk.data))
            with self._cond:
                self._traffic[peer][0] += len(chunk.data)
            yield chunk

    def on_fail(self, action: Callable[[], object]) -> None:
        """Run ``action`` (cancel a call) if the all-reduce fails, at once if it already has."""
        with self._cond:
            if not self._failure:
                self._on_fail.append(action)
                return
        action()

    def take(self, peer: int, chunk: Chunk) -> None:
        """A chunk ``peer`` sent; raises ``CorruptPayload`` if it is not one this all-reduce expects."""
        if chunk.round != self.round or chunk.sender != peer:
            raise CorruptPayload(f"chunk of round {chunk.round} from worker {chunk.sender} on worker {peer}'s stream")
        if chunk.step == DONE:
            with self._cond:
                if not self._holds_all_from(peer):
                    raise CorruptPayload(f"worker {peer} said done before it sent all it owes")
                self._settled.add(peer)
                self._cond.notify_all()
            return
        if chunk.step == CONTRIBUTE:
            ranges, target, base = self._mine, self._taken[peer], self._lo
        elif chunk.step == SUMMED and not self.plan.gather:
            ranges, target, base = self.plan.chunks(peer), self._gathered, 0
        else:
            raise CorruptPayload(f"unexpected step {chunk.step} from worker {peer}")
        key = (peer, chunk.step)
        if chunk.count != len(ranges) or not 0 <= chunk.index < chunk.count or chunk.dtype != self._dtype_name:
            raise CorruptPayload(f"chunk {chunk.index}/{chunk.count} of {chunk.dtype}, expected {len(ranges)} chunks")
        a, b = ranges[chunk.index]
        view = target[a - base : b - base]
        if len(chunk.data) != view.numel() * view.element_size():
            raise CorruptPayload(f"chunk {chunk.index} of step {chunk.step} has {len(chunk.data)} bytes")
        if xxh3_64_intdigest(chunk.data) != chunk.checksum:
            raise CorruptPayload(f"chunk {chunk.index} of step {chunk.step} fails its checksum")
        with self._cond:
            if chunk.index in self._seen[key]:
                raise CorruptPayload(f"chunk {chunk.index} of step {chunk.step} arrived twice")
        if view.numel():
            view.view(torch.uint8).numpy().data[:] = chunk.data
        with self._cond:
            self._seen[key].add(chunk.index)
            self._traffic[peer][1] += len(chunk.data)
            ready = False
            if chunk.step == CONTRIBUTE:
                self._arrived[chunk.index] += 1
                ready = self._arrived[chunk.index] == len(self.peers)
            self._finish_locked(peer)
            self._cond.notify_all()
        if ready:
            self._sum(chunk.index)

    def _sum(self, k: int) -> None:
        """Sum chunk ``k`` of this worker's share over every member, in member order, and send it on."""
        a, b = self._mine[k]
        total = torch.zeros(b - a, dtype=self.total.dtype)
        for m in self.plan.members:
            total.add_(self._own[a:b] if m == self.me else self._taken[m][a - self._lo : b - self._lo])
        if self.plan.gather:
            self.total[a:b] = total
        else:
            summed = self._summed_wire[a - self._lo : b - self._lo]
            summed.copy_(total)
            self.total[a:b] = summed
            for p in self.peers:
                self._queues[p].put(self._chunk(SUMMED, k, len(self._mine), summed))
        with self._cond:
            self._summed += 1
            for p in self.peers:
                self._finish_locked(p)
            self._cond.notify_all()

    def _holds_all_from(self, peer: int) -> bool:
        return all(len(self._seen[(peer, step)]) == self._expected[(peer, step)] for step in (CONTRIBUTE, SUMMED))

    def _finish_locked(self, peer: int) -> None:
        """Once this worker holds all ``peer`` sent and has sent it all it owes, say DONE and end the stream."""
        if peer not in self._finished and self._summed == len(self._mine) and self._holds_all_from(peer):
            self._finished.add(peer)
            self._queues[peer].put(Chunk(self.round, self.me, 0, 1, 0, self._dtype_name, 0, b"", step=DONE))
            self._queues[peer].put(None)

    def closed(self, peer: int, error: BaseException | None) -> None:
        """``peer``'s stream ended (``error`` if it failed): fails the all-reduce if anything from it is missing."""
        with self._cond:
            if self._holds_all_from(peer):
                self._settled.add(peer)
                self._cond.notify_all()
                return
        self.fail(f"the stream with worker {peer} ended early: {_why(error)}")

    def fail(self, reason: str) -> None:
        """Give up (unless done): streams end, calls are cancelled, ``wait`` raises ``AllReduceFailed``."""
        with self._cond:
            if self._failure or self._complete_locked():
                return
            self._failure = reason
            actions, self._on_fail = self._on_fail, []
            for chunks in self._queues.values():
                chunks.put(None)
            self._cond.notify_all()
        for action in actions:
            action()

    def _complete_locked(self) -> bool:
        return self._settled.issuperset(self.peers) and self._summed == len(self._mine)

    def wait(self, gone: Callable[[], Iterable[int]] | None = None) -> torch.Tensor:
        """The sum over every member, once complete; ``AllReduceFailed`` on any failure or past the deadline.

        While it waits, ``gone()`` is asked every ``POLL_S`` which members will not come; any fails it at once.
        """
        while True:
            with self._cond:
                until = min(self.deadline, time.monotonic() + POLL_S)
                self._cond.wait_for(
                    lambda: bool(self._failure) or self._complete_locked(), timeout=max(0.0, until - time.monotonic())
                )
                if self._failure:
                    raise AllReduceFailed(f"round {self.round}: {self._failure}")
                if self._complete_locked():
                    break
            if time.monotonic() >= self.deadline:
                self.fail("not done by its deadline")
            for p in set(gone() if gone is not None else ()) & set(self.peers):
                self.fail(f"worker {p} is gone")
        for p in () if self.plan.gather else self.peers:
            a, b = self.plan.share(p)
            self.total[a:b] = self._gathered[a:b]
        return self.total

    def traffic(self) -> dict[int, tuple[int, int]]:
        with self._cond:
            return {p: (sent, received) for p, (sent, received) in self._traffic.items()}


class Reductions:
    """The all-reduce a node runs now, by round, for its service to hand incoming streams to."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._current: Reduction | None = None
        self._latest = -1

    def open(self, reduction: Reduction) -> None:
        with self._cond:
            if reduction.round <= self._latest:
                raise ValueError(f"all-reduce round {reduction.round} is not after round {self._latest}")
            self._current, self._latest = reduction, reduction.round
            self._cond.notify_all()

    def close(self, reduction: Reduction) -> None:
        with self._cond:
            if self._current is reduction:
                self._current = None

    def get(self, round: int, timeout: float) -> Reduction | None:
        """The all-reduce of ``round``, waiting up to ``timeout`` s for it to open; None if it is not (or no longer)
        running."""
        with self._cond:
            self._cond.wait_for(lambda: self._latest >= round, timeout=timeout)
            current = self._current
            return current if current is not None and current.round == round else None


def _why(error: BaseException | None) -> str:
    """What ended a stream, in one line: a gRPC error's code and details (not the call's repr), else the error."""
    if error is None:
        return "closed"
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if callable(code) and callable(details):  # grpc.RpcError
        return f"{getattr(code(), 'name', code())}: {details()}"
    return str(error) or type(error).__name__
