"""One worker's gossip state for the current round: what it sends, what peers sent, and which edges were used.

An edge is *used* in a round only if both ends keep the other's payload, and
each end keeps it only once it knows its own payload was received:

- the caller (the lower worker index) streams its payload and takes in the
  callee's; once it holds the callee's whole payload (so the callee already
  holds the caller's: the callee ends its stream only after taking it all in),
  it asks the callee to commit the edge;
- the callee decides, under this mailbox's lock: it commits if the round is
  still open here and it holds the caller's payload, and refuses once its
  round has closed (deadline passed). The decision is recorded, so a caller
  whose answer was lost in a cut asks again and gets the same answer;
- the caller keeps the payload only on the callee's "committed".

So a cut at any moment leaves the edge used on both ends or on neither, the
mixing matrix stays symmetric and doubly stochastic, and the workers' mean is
preserved. A peer whose link fails (refused, reset, corrupt) is marked failed
at once, so a round never waits out its deadline for it.

A round names the peers it exchanges with; anyone else is refused at once (no
payload taken, no commit), so leaving a peer out is symmetric too. A round
may give up on a peer it learns will not come (``fail``), but never on an edge
whose commit is already out: the callee may have said yes.

Receive buffers are recycled: the buffers behind the payloads handed out by
``collect`` are reused once the next round is posted (fresh memory costs page
faults that take longer than the copy into it). Buffers of payloads that
never completed are not reused, as a late stream may still write them.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterable, Mapping

import torch

from .chunks import Assembly

DECISIONS_KEPT = 8  # past rounds whose commit decisions a late caller may still ask for


class Edge(enum.Enum):
    RECEIVED = "received"  # the peer's payload is complete here, not yet committed
    COMMITTING = "committing"  # caller side: the commit request is out
    KEPT = "kept"
    FAILED = "failed"


FINAL = (Edge.KEPT, Edge.FAILED)


class Mailbox:
    """Thread-safe hand-over between ``GossipNode.exchange`` and the links serving it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._round = -1
        self._open = False  # the current round still accepts commits
        self._outgoing: torch.Tensor | None = None
        self._per_peer: Mapping[int, torch.Tensor] = {}
        self._assemblies: dict[int, Assembly] = {}
        self._wanted: frozenset[int] = frozenset()
        self._edges: dict[int, Edge] = {}
        self._decisions: dict[int, frozenset[int]] = {}  # round -> peers whose commit this worker answered yes
        self._handed_out: list[bytearray] = []
        self._spare: list[bytearray] = []

    def post(
        self,
        round: int,
        peers: Iterable[int],
        payload: torch.Tensor,
        per_peer: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        """Open ``round`` with ``peers``: ``payload`` for each, or ``per_peer[j]`` for the peers named there."""
        with self._cond:
            if round <= self._round:
                raise ValueError(f"round {round} is not after round {self._round}")
            self._close_locked()
            size = payload.numel() * payload.element_size()
            self._spare = [b for b in self._spare + self._handed_out if len(b) == size]
            self._handed_out = []
            self._round = round
            self._open = True
            self._outgoing = payload
            self._per_peer = dict(per_peer or {})
            self._assemblies = {}
            self._wanted = frozenset(peers)
            self._edges = {}
            self._cond.notify_all()

    def outgoing(self, round: int, timeout: float, peer: int | None = None) -> torch.Tensor | None:
        """Our payload for ``round`` (to ``peer``), waiting up to ``timeout`` s for it to be posted."""
        with self._cond:
            self._cond.wait_for(lambda: self._round >= round, timeout=timeout)
            if self._round != round:
                return None
            return self._per_peer.get(peer, self._outgoing) if peer is not None else self._outgoing

    def assembly(self, round: int, peer: int) -> Assembly | None:
        """Where ``peer``'s payload for ``round`` is put together; None if the round is not current, is closed,
        or is not with ``peer``."""
        with self._cond:
            outgoing = self._per_peer.get(peer, self._outgoing)
            if round != self._round or not self._open or outgoing is None or peer not in self._wanted:
                return None
            if peer not in self._assemblies:
                size = outgoing.numel() * outgoing.element_size()
                spare = [k for k, b in enumerate(self._spare) if len(b) == size]
                buffer = self._spare.pop(spare[-1]) if spare else bytearray(size)
                self._assemblies[peer] = Assembly(round, peer, buffer)
            return self._assemblies[peer]

    def received(self, assembly: Assembly) -> None:
        """``assembly`` is complete; the edge is used once it is committed."""
        with self._cond:
            if self._current(assembly) and assembly.sender not in self._edges:
                self._edges[assembly.sender] = Edge.RECEIVED
                self._cond.notify_all()

    def fail(self, round: int, peer: int) -> None:
        """The edge to ``peer`` is unused this round (its link failed, or the peer will not come); not once it was
        kept, nor while our commit request is out."""
        with self._cond:
            if round == self._round and self._edges.get(peer) not in (Edge.KEPT, Edge.COMMITTING):
                self._edges[peer] = Edge.FAILED
                self._cond.notify_all()

    def settled(self, round: int, until: float) -> bool:
        """Wait until every edge of ``round`` is decided (True), or ``until`` (monotonic) passes (False)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._round != round or all(self._edges.get(p) in FINAL for p in self._wanted),
                timeout=max(0.0, until - time.monotonic()),
            )

    def commit(self, round: int, peer: int) -> bool:
        """Callee side: ``peer`` holds our payload and asks to use the edge; True if we keep its payload.

        Idempotent: a repeated request for a round gets the answer first given.
        """
        with self._cond:
            if round != self._round:
                return peer in self._decisions.get(round, frozenset())
            if self._edges.get(peer) is Edge.KEPT:
                return True
            if not self._open or self._edges.get(peer) is not Edge.RECEIVED:
                return False
            self._edges[peer] = Edge.KEPT
            self._cond.notify_all()
            return True

    def begin_commit(self, assembly: Assembly) -> bool:
        """Caller side: may the commit request for ``assembly``'s edge go out? (No once the round closed.)"""
        with self._cond:
            if not self._current(assembly) or not self._open or self._edges.get(assembly.sender) is Edge.FAILED:
                return False
            self._edges[assembly.sender] = Edge.COMMITTING
            return True

    def end_commit(self, assembly: Assembly, kept: bool) -> None:
        """Caller side: the callee's answer (False also when no answer came)."""
        with self._cond:
            if self._current(assembly) and self._edges.get(assembly.sender) is Edge.COMMITTING:
                self._edges[assembly.sender] = Edge.KEPT if kept else Edge.FAILED
                self._cond.notify_all()

    def collect(self, round: int, deadline: float, grace: float) -> dict[int, torch.Tensor]:
        """The payloads of the edges used in ``round``, once every peer's edge is decided or ``deadline`` passed.

        At the deadline the round closes (commits are refused from then on);
        commits already out are waited for until ``deadline + grace``. The
        tensors are views of receive buffers that the next round reuses.
        """
        self.settled(round, deadline)
        with self._cond:
            wanted = self._wanted
            if self._round != round:
                return {}
            self._open = False
            self._cond.wait_for(
                lambda: all(self._edges.get(p) is not Edge.COMMITTING for p in wanted),
                timeout=max(0.0, deadline + grace - time.monotonic()),
            )
            kept = {p for p in wanted if self._edges.get(p) is Edge.KEPT}
            for p in wanted - kept:
                self._edges[p] = Edge.FAILED
            self._decisions[round] = frozenset(kept)
            received = {p: self._assemblies[p] for p in kept}
            self._handed_out.extend(a.buffer for a in received.values())
            self._assemblies = {}  # late stripes can no longer complete a payload for this round
            return {p: a.tensor() for p, a in received.items()}

    def _current(self, assembly: Assembly) -> bool:
        return assembly.round == self._round and self._assemblies.get(assembly.sender) is assembly

    def _close_locked(self) -> None:
        """Record the current round's decisions before a new round is posted (a round never collected keeps none)."""
        if self._round >= 0 and self._round not in self._decisions:
            self._decisions[self._round] = frozenset(p for p, e in self._edges.items() if e is Edge.KEPT)
        for old in sorted(self._decisions)[:-DECISIONS_KEPT]:
            del self._decisions[old]
